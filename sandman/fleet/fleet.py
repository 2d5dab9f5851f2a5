"""Run an RL batch: problems x rollouts on sandboxes, under a concurrency cap.

The clock starts before any pool is made, for every strategy, so a strategy
that warms early pays for it in the same wall time it is judged by. A result
is either valid (the task ran: ``ok`` or ``task_failed``) or an
infrastructure failure after retries; nothing is dropped and no
infrastructure error ever turns into a zero reward.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandman.client import Sandbox, SandmanClient, Timings
from sandman.client.errors import SandmanError, TransportError
from sandman.contract import LABEL_RUN, LABEL_STATE, STATE_QUARANTINED, parse_duration
from sandman.fleet import strategies
from sandman.fleet.prepull import Prepuller, choose_problems
from sandman.fleet.progress import Progress, snapshot
from sandman.fleet.records import Attempt, Outcome, RolloutRecord, RunData, Source
from sandman.fleet.retry import after_failure, infra_failure
from sandman.fleet.reuse import ProblemState, sandboxes_per_problem
from sandman.fleet.spans import SpanBook
from sandman.kube_async import MERGE_PATCH, PODS, ApiError
from sandman.pools import NoIdlePod, PoolSpec
from sandman.pools.manager import ManagerConfig, PoolManager

# A pool plan that failed without an answer is tried again this much later
# (a killed webhook replica or a restarted apiserver is back in seconds).
PLAN_RETRY_S = 1.0
# Waiting for the apiserver (the pool manager's first list of pods, pool
# plans that keep failing) is said in the log once it lasts this long.
WAIT_NOTICE_S = 2.0

log = logging.getLogger(__name__)
Task = Callable[[Sandbox, "Problem", int], Awaitable[float]]
ResetFn = Callable[[Sandbox], Awaitable[Mapping[str, Any]]]
# Called with each rollout's record as soon as it has its final outcome.
OnResult = Callable[[RolloutRecord], Awaitable[None] | None]


@dataclass(frozen=True)
class Problem:
    id: str
    image: str
    data: Any = None  # handed to the task untouched


@dataclass(frozen=True)
class FleetConfig:
    strategy: str = "none"
    concurrency: int = 16
    window: int = 4  # problems per window (sliding / pipelined)
    reuse: bool = False
    # Sandboxes per problem when reusing; 0: as few as fill the concurrency
    # (reuse.sandboxes_per_problem).
    k: int = 0
    max_reuses: int = 8  # rollouts one sandbox serves before it is rotated out
    max_attempts: int = 3  # per rollout, for retryable infrastructure failures
    ttl: str = "30m"  # lease of every sandbox the run holds
    ready_timeout_s: float = 300.0
    claim_wait_s: float = 2.0  # wait this long for a growing pool's next pod
    keep_quarantined: bool = False  # leave drifted sandboxes (labeled) for a post-mortem
    # Pre-pull the images of this many problems after the warm ones (0: off),
    # onto the nodes sandman-scheduler's extender picks (sandman/fleet/prepull.py);
    # with ``extender_url`` images some node holds or pulls are skipped.
    prepull_ahead: int = 0
    extender_url: str | None = None
    # How long the run waits for the apiserver before it gives up: for the
    # pool manager's first list of the namespace's pods, and for pool plans
    # that keep failing without an answer (5xx, 429, no connection). Without a
    # bound an unreachable apiserver kept `fleet run` retrying forever.
    api_wait_s: float = 60.0
    prepull_command: Sequence[str] = ("true",)
    command: Sequence[str] | None = None
    resources: Mapping[str, Any] | None = None
    node_selector: Mapping[str, str] | None = None
    tolerations: Sequence[Mapping[str, Any]] | None = None
    pools: ManagerConfig = field(default_factory=ManagerConfig)

    def __post_init__(self) -> None:
        strategies.check(self.strategy, self.window)
        if self.concurrency < 1 or self.max_reuses < 1 or self.max_attempts < 1:
            raise ValueError("concurrency, max_reuses and max_attempts must be >= 1")
        if self.k < 0:
            raise ValueError("k must be >= 1, or 0 to choose it from the batch")
        if self.api_wait_s <= 0:
            raise ValueError("api_wait_s must be > 0")


class Fleet:
    """One batch run. ``await Fleet(client, config).run(problems, rollouts, task)``."""

    plan_failing_since: float | None = None  # pool plans have failed since (monotonic)
    fatal: BaseException | None = None  # the run cannot go on: the dispatcher raises it

    def __init__(
        self, client: SandmanClient, config: FleetConfig, *, reset_fn: ResetFn | None = None
    ) -> None:
        self.client, self.config = client, config
        self.reset_fn = reset_fn or (lambda sb: sb.reset())
        self.run_id = secrets.token_hex(3)
        self.ttl = parse_duration(config.ttl, field="ttl")

    async def run(
        self,
        problems: Sequence[Problem],
        rollouts: int,
        task: Task,
        *,
        on_result: OnResult | None = None,
    ) -> RunData:
        """Run the batch; ``on_result(record)`` hears of each result as it completes
        (an error it raises is logged, and re-raised once the run has cleaned up)."""
        cfg = self.config
        t0 = time.monotonic()  # before any warming, for every strategy
        self.t0, self.task, self.problems = t0, task, list(problems)
        self.k = sandboxes_per_problem(cfg.k, cfg.concurrency, len(problems), rollouts)
        self._on_result, self._result_error = on_result, None
        self.data = RunData(
            cfg.strategy,
            cfg.reuse,
            len(problems),
            rollouts,
            cfg.concurrency,
            params={"window": cfg.window, "k": self.k, "max_reuses": cfg.max_reuses},
        )
        self.spans = SpanBook(t0)
        self.state = [ProblemState(i, rollouts, rollouts, rollouts) for i in range(len(problems))]
        self.pools: dict[int, str] = {}
        self.pool_problem: dict[str, str] = {}
        # Pools whose ensure has not returned or failed (a timeout, a 5xx, the
        # run cancelled mid-create): the ReplicaSet may exist all the same, so
        # the cleanup deletes them too.
        self.unconfirmed: set[str] = set()
        self.changed = asyncio.Event()
        self.replan = asyncio.Event()
        self.plan_lock = asyncio.Lock()
        self.pm = PoolManager(
            self.client.kube,
            self.client.namespace,
            cfg.pools,
            on_pod=lambda kind, pod: self.spans.pool_pod(kind, pod, self.pool_problem.get),
            telemetry=self.client.telemetry,
        )
        self.prepuller = None
        if cfg.prepull_ahead > 0:
            self.prepuller = Prepuller(
                self.client.kube,
                self.client.namespace,
                self.run_id,
                take_token=self.pm.limiter.try_refill,  # never ahead of a rollout's create
                extender_url=cfg.extender_url,
                pod_options={
                    "command": cfg.prepull_command,
                    "node_selector": cfg.node_selector,
                    "tolerations": cfg.tolerations,
                },
            )
        self.plan_failing_since, self.fatal = None, None
        await self._start_pools()
        try:
            planner = asyncio.create_task(self._planner())
            try:
                await self._plan()
                await self._dispatch(rollouts)
            finally:
                await asyncio.shield(self._stop_planning(planner))
        finally:
            await self.pm.__aexit__(None, None, None)
        c = self.data.counters
        if self.prepuller is not None:
            c.prepulls, c.prepulls_skipped = self.prepuller.created, self.prepuller.skipped
        c.pods_created = self.pm.stats.pool_pods_created + self.pm.stats.on_demand_created
        c.claims, c.claim_conflicts = self.pm.stats.claims, self.pm.stats.claim_conflicts
        self.data.spans = list(self.spans.spans.values())
        self.data.t_end = time.monotonic() - t0
        self.client.telemetry.tracing.fleet_run(self.run_id, self.data, t0)
        if self._result_error is not None:
            raise self._result_error
        return self.data

    async def stream(
        self, problems: Sequence[Problem], rollouts: int, task: Task
    ) -> AsyncIterator[RolloutRecord]:
        """The batch's records as they complete (``self.data`` has the run once it ends).

        Leaving the loop early cancels the run; its pools are still cleaned up.
        """
        queue: asyncio.Queue[RolloutRecord | None] = asyncio.Queue()
        runner = asyncio.create_task(self.run(problems, rollouts, task, on_result=queue.put_nowait))
        runner.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (rec := await queue.get()) is not None:
                yield rec
            await runner  # its error, if it failed
        finally:
            if not runner.done():
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runner

    def progress(self) -> Progress:
        """Counts by state and TTFC so far (safe to call while ``run`` is running)."""
        data = getattr(self, "data", None)
        if data is None:
            return snapshot([], 0, 0.0)
        total = data.problems * data.rollouts_per_problem
        return snapshot(data.records, total, time.monotonic() - self.t0)

    async def _finished(self, rec: RolloutRecord) -> None:
        """A rollout has its final outcome: tell the caller now, before any reset.

        MUST NOT raise into the rollout: its sandbox still has to be reset or
        released, and its problem's bookkeeping settled, whatever the callback does.
        """
        if self._on_result is None:
            return
        try:
            out = self._on_result(rec)
            if inspect.isawaitable(out):
                await out
        except Exception as e:
            log.exception("on_result failed for %s#%d", rec.problem, rec.rollout)
            if self._result_error is None:
                self._result_error = e

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _api(self) -> str:
        client = getattr(self, "client", None)
        return f"the apiserver at {client.kube.creds.server}" if client else "the apiserver"

    async def _start_pools(self) -> None:
        """Start the pool manager: its first list of the namespace's pods, waited
        for at most ``api_wait_s``, saying so when it takes a while."""
        cfg, ns = self.config, self.client.namespace
        what = f"{self._api()} to list pods in namespace {ns}"
        enter = asyncio.ensure_future(self.pm.__aenter__())
        done, _ = await asyncio.wait({enter}, timeout=min(WAIT_NOTICE_S, cfg.api_wait_s))
        if not done:
            log.warning("waiting up to %.0fs for %s", cfg.api_wait_s, what)
        try:
            await asyncio.wait_for(enter, max(0.0, cfg.api_wait_s - WAIT_NOTICE_S))
        except BaseException as e:
            await self.pm.__aexit__(None, None, None)  # stop its watch and loops
            if isinstance(e, TimeoutError):
                raise TransportError(
                    f"gave up after {cfg.api_wait_s:.0f}s waiting for {what} "
                    "(the warnings above say why; the wait is FleetConfig.api_wait_s, "
                    "`fleet run --api-wait`)"
                ) from None
            raise

    # -- pools -------------------------------------------------------------------
    async def _plan(self) -> None:
        """Bring pools in line with the strategy's targets for where the run is now.

        A failure that is not an answer (the webhook down, the apiserver
        restarting: 5xx, 429, no connection) is logged and planned again
        ``PLAN_RETRY_S`` later: it must not end the dispatcher (seen in a
        scale run with the webhook killed mid-burst: the whole fleet failed)."""
        async with self.plan_lock:  # the dispatcher and the planner both plan
            try:
                await self._plan_locked()
                self.plan_failing_since = None
            except (ApiError, OSError, TimeoutError) as e:
                if isinstance(e, ApiError) and e.status < 500 and e.status != 429:
                    raise
                now = time.monotonic()
                since = self.plan_failing_since = self.plan_failing_since or now
                left = self.config.api_wait_s - (now - since)
                if left <= 0:
                    self.fatal = TransportError(
                        f"gave up after {self.config.api_wait_s:.0f}s of failed pool plans "
                        f"on {self._api()}: {e}"
                    )
                    self._changed()  # the dispatcher raises it
                    return
                log.warning(
                    "pool planning failed (retrying in %.0fs, giving up in %.0fs): %s",
                    PLAN_RETRY_S, left, e,
                )  # fmt: skip
                asyncio.get_running_loop().call_later(PLAN_RETRY_S, self._changed)

    async def _plan_locked(self) -> None:
        cfg = self.config
        remaining = [s.unserved if s.broken is None else 0 for s in self.state]
        want = [s.want(cfg.reuse, self.k) for s in self.state]
        targets = strategies.pool_targets(cfg.strategy, cfg.window, remaining, want=want)
        # New pools are made concurrently (naive makes 100 at once), in
        # problem order for the create budget; each is recorded only once the
        # manager has it: an ensure that failed (the webhook down, the
        # apiserver restarting) is tried again at the next plan instead of
        # leaving a pool nobody manages.
        new = {i: f"{self.run_id}-{i}" for i in targets if i not in self.pools}
        for i, name in new.items():
            self.pool_problem[name] = self.problems[i].id
        self.unconfirmed.update(new.values())  # until its ensure has returned
        made = await asyncio.gather(
            *(self.pm.ensure(self._pool_spec(new[i], self.problems[i], targets[i])) for i in new),
            return_exceptions=True,
        )
        failed = None
        for (i, name), err in zip(new.items(), made, strict=True):
            if isinstance(err, BaseException):
                failed = failed or err
            else:
                self.pools[i] = name
                self.unconfirmed.discard(name)
        for i, n in targets.items():
            if i in self.pools:
                self.pm.set_target(self.pools[i], n)
        # A pool is forgotten only once its delete succeeded: one that failed
        # is deleted again at the next plan or at the cleanup, never left.
        gone = [i for i in self.pools if i not in targets]
        deleted = await asyncio.gather(
            *(self.pm.delete(self.pools[i]) for i in gone), return_exceptions=True
        )
        for i, err in zip(gone, deleted, strict=True):
            if isinstance(err, BaseException):
                failed = failed or err
            else:
                del self.pools[i]
        if self.prepuller is not None:
            begun = [s.undispatched < s.rollouts for s in self.state]
            ahead = choose_problems(cfg.strategy, cfg.window, remaining, begun, cfg.prepull_ahead)
            self.prepuller.want([self.problems[i].image for i in ahead])
        if failed is not None:
            raise failed

    def _pod_options(self) -> dict[str, Any]:
        """What every pod of the run gets, warm or on demand."""
        cfg = self.config
        return {
            "command": cfg.command,
            "resources": cfg.resources,
            "ttl": cfg.ttl,
            "labels": {LABEL_RUN: self.run_id},
            "node_selector": cfg.node_selector,
            "tolerations": cfg.tolerations,
        }

    def _pool_spec(self, name: str, problem: Problem, size: int) -> PoolSpec:
        return PoolSpec(name, problem.image, size=size, **self._pod_options())

    # -- dispatch ------------------------------------------------------------------
    async def _dispatch(self, rollouts: int) -> None:
        cfg = self.config
        slots = asyncio.Semaphore(cfg.concurrency)
        running: set[asyncio.Task[None]] = set()
        next_rollout = [0] * len(self.state)
        records = {}
        for s in self.state:
            for r in range(rollouts):
                rec = RolloutRecord(self.problems[s.index].id, r, t_queued=self._now())
                records[(s.index, r)] = rec
                self.data.records.append(rec)
        while any(s.undispatched for s in self.state):
            await slots.acquire()
            while (s := self._pick()) is None:
                if self.fatal is not None:
                    raise self.fatal
                self.changed.clear()
                self.replan.set()
                await self.changed.wait()
            s.undispatched -= 1
            r = next_rollout[s.index]
            next_rollout[s.index] += 1
            rec = records[(s.index, r)]
            rec.t_slot = self._now()
            stashed = s.idle.pop() if s.idle else None
            reserved = cfg.reuse and stashed is None and s.broken is None
            if reserved:
                s.reserve()  # one of the problem's k, for the sandbox this rollout gets
            # The planner task re-plans; the dispatcher never waits for it. A
            # plan makes API writes (pools created, deleted), each 0.3-1 s on
            # the loaded 2-core machine, so planning on the dispatch path let
            # `naive` start ~1-3 rollouts/s: 321 s for 100 x 8 on kwok, where
            # `none` took 62 s (docs/pools.md).
            self.replan.set()
            t = asyncio.create_task(self._traced_rollout(s, r, rec, stashed, reserved))
            running.add(t)
            t.add_done_callback(lambda t: (running.discard(t), slots.release()))
        await asyncio.gather(*running)

    def _pick(self) -> ProblemState | None:
        """The earliest problem that can start a rollout now (problem-major order)."""
        for s in self.state:
            if s.can_start(self.config.reuse, self.k):
                return s
        return None

    def _changed(self) -> None:
        self.changed.set()
        self.replan.set()

    async def _planner(self) -> None:
        """Re-plan pools whenever rollouts move on (acquired, finished, failed)."""
        while True:
            await self.replan.wait()
            self.replan.clear()
            try:
                await self._plan()
            except (ApiError, OSError, TimeoutError) as e:
                log.warning("pool planning failed (retrying at the next change): %s", e)

    # -- one rollout ------------------------------------------------------------------
    async def _traced_rollout(
        self,
        s: ProblemState,
        r: int,
        rec: RolloutRecord,
        stashed: Sandbox | None,
        reserved: bool,
    ) -> None:
        """``_rollout`` inside its trace span (a no-op unless tracing is configured)."""
        with self.client.telemetry.tracing.rollout(self.run_id, rec, self.t0):
            await self._rollout(s, r, rec, stashed, reserved)

    async def _rollout(
        self,
        s: ProblemState,
        r: int,
        rec: RolloutRecord,
        stashed: Sandbox | None,
        reserved: bool,
    ) -> None:
        cfg = self.config
        problem = self.problems[s.index]
        holds = reserved  # counted in s.live without a sandbox in hand yet
        for attempt_no in range(cfg.max_attempts):
            a = Attempt(t_requested=self._now())
            rec.attempts.append(a)
            if s.broken is not None:
                await self._give_back(s, stashed, holds)
                a.error_reason, a.retryable = s.broken[0], False
                rec.outcome, rec.detail = Outcome.INFRA_FAILED, f"not started: {s.broken[1]}"
                s.gave_up()
                await self._finished(rec)
                return
            sb: Sandbox | None = None
            try:
                if stashed is not None:
                    sb, a.source, stashed = stashed, Source.REUSED, None
                    sb.timings = Timings(requested=time.monotonic())
                    s.reused()
                else:
                    sb, a.source, a.warm = await self._acquire(s, problem)
                holds = False  # s.live now counts the sandbox itself
                a.sandbox, a.t_acquired = sb.name, self._now()
                a.phases = {
                    k: v
                    for k, v in sb.timings.phases().items()
                    if k not in ("ttfc_s", "first_command_s")
                }
                self._changed()
                self.spans.served(sb.name)
                try:
                    rec.reward = float(await self.task(sb, problem, r))
                    rec.outcome = Outcome.OK
                except Exception as e:
                    if infra_failure(e) is not None:
                        s.needs_another()
                        raise
                    rec.outcome, rec.detail = Outcome.TASK_FAILED, f"{type(e).__name__}: {e}"
                a.t_done = self._now()
                if sb.timings.first_result is not None:
                    a.t_first_result = sb.timings.first_result - self.t0
                await self._finished(rec)
                await self._after(s, sb)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                why = infra_failure(e)
                if why is None:
                    raise
                a.error_reason, a.retryable = why
                a.t_done = self._now()
                rec.detail = f"{why[0]}: {e}"
                await self._give_back(s, sb, holds)
                holds = False
                step = after_failure(e, a.retryable, attempt_no, cfg.max_attempts)
                if step.broken:
                    s.broken = (why[0], str(e))  # retrying will not make the image appear
                if not step.retry:
                    break
                self.data.counters.infra_retries += 1
                if cfg.reuse:
                    s.reserve()
                    holds = True
                self._changed()
        rec.outcome = Outcome.INFRA_FAILED
        s.gave_up()
        self._changed()
        await self._finished(rec)

    async def _give_back(self, s: ProblemState, sb: Sandbox | None, holds: bool) -> None:
        """A failed or refused rollout lets go of what it had: its sandbox, or
        its reservation."""
        if sb is not None:
            await self._drop(s, sb)
        elif holds:
            s.unreserve()

    async def _acquire(self, s: ProblemState, problem: Problem) -> tuple[Sandbox, Source, bool]:
        """A warm pod from the problem's pool if it has one, else a new pod;
        and whether it was Ready when claimed (a warm claim)."""
        cfg = self.config
        pool = self.pools.get(s.index)
        requested = time.monotonic()
        if pool is not None:
            try:
                res = await self.pm.claim(
                    pool, claimer=f"fleet-{self.run_id}", ttl=self.ttl, wait_s=cfg.claim_wait_s
                )
            except NoIdlePod:
                pass
            else:
                self._acquired(s)  # counted as soon as it is ours, not when Ready
                sb = Sandbox(self.client, res.pod)
                sb.timings = Timings(requested=requested, created=time.monotonic())
                self.spans.claimed(sb.name)
                if not res.ready:
                    try:
                        await sb.wait_ready(cfg.ready_timeout_s)
                    except BaseException:
                        self._lost(s)
                        await self._release(sb)
                        raise
                self.spans.ready(sb.name)
                return sb, Source.CLAIMED, res.ready

        made: list[str] = []

        async def create(body: dict[str, Any], ns: str) -> dict[str, Any]:
            pod = await self.pm.create_pod(body, ns)
            made.append(pod["metadata"]["name"])
            self._acquired(s)
            self.spans.created(made[0], problem.id, requested - self.t0)
            return pod  # type: ignore[no-any-return]

        try:
            sb = await Sandbox.create(
                self.client,
                problem.image,
                **self._pod_options(),
                timeout_s=cfg.ready_timeout_s,
                create_fn=create,
            )
        except BaseException:
            if made:  # Sandbox.create deleted the pod that failed to start
                self.spans.released(made[0])
                self._lost(s)
            raise
        sb.timings.requested = requested
        self.spans.ready(sb.name)
        return sb, Source.CREATED, False

    def _acquired(self, s: ProblemState) -> None:
        """A rollout's demand met: pool targets follow at once."""
        s.acquired(self.config.reuse)
        self._changed()

    def _lost(self, s: ProblemState) -> None:
        """A rollout's demand back (its new sandbox did not come up)."""
        s.lost(self.config.reuse)
        self._changed()

    async def _after(self, s: ProblemState, sb: Sandbox) -> None:
        """After a rollout: reset for the next one, rotate, or release."""
        cfg = self.config
        if not cfg.reuse:
            await self._release(sb)
            return
        s.uses[sb.name] = s.uses.get(sb.name, 0) + 1
        if s.unserved <= 0 or s.uses[sb.name] >= cfg.max_reuses:
            if s.unserved > 0:
                self.data.counters.rotations += 1
            await self._drop(s, sb)
            return
        self.data.counters.resets += 1
        try:
            result = await self.reset_fn(sb)
            # MUST come after the reset: a restart during the rollout or the
            # reset voids its clean verdict (sandman/client/reuse.py).
            why = await sb.reuse_refusal(dict(result))
        except (SandmanError, ApiError, OSError, TimeoutError) as e:
            why = f"reset failed: {e}"
        if why is None:
            s.idle.append(sb)
            self._changed()
            return
        log.warning("not reusing %s (%s): replacing it", sb.name, why)
        self.data.counters.resets_dirty += 1
        await self._quarantine(sb)
        await self._drop(s, sb, quarantined=True)

    async def _quarantine(self, sb: Sandbox) -> None:
        if not self.config.keep_quarantined:
            return
        try:
            await self.client.kube.patch(
                PODS,
                sb.name,
                {"metadata": {"labels": {LABEL_STATE: STATE_QUARANTINED}}},
                sb.namespace,
                content_type=MERGE_PATCH,
            )
            sb.released = True  # left for inspection; its lease still ends it
        except ApiError as e:
            log.warning("could not label %s quarantined: %s", sb.name, e)

    async def _drop(self, s: ProblemState, sb: Sandbox, *, quarantined: bool = False) -> None:
        s.dropped(self.config.reuse)
        await self._release(sb, quarantined=quarantined)
        self._changed()

    async def _release(self, sb: Sandbox, *, quarantined: bool = False) -> None:
        self.spans.released(sb.name, quarantined=quarantined)
        try:
            await sb.release()
        except (ApiError, OSError, TimeoutError) as e:
            log.warning("release of %s failed (%s); its lease will end it", sb.name, e)

    async def _stop_planning(self, planner: asyncio.Task[None]) -> None:
        """Stop the planner between plans, then delete the run's pools.

        Cancelled mid-plan, a pool create or delete already sent could land
        with the fleet never recording it: a ReplicaSet left behind after the
        run (seen in CI, 2026-12-01). Taking the plan lock first lets a plan
        in flight finish, so every pool it made is in ``self.pools``.
        """
        async with self.plan_lock:
            planner.cancel()
            try:
                await planner
            except asyncio.CancelledError:
                pass
            except Exception:  # its error must not keep the pools from being deleted
                log.exception("the pool planner failed")
            await self._cleanup()

    async def _cleanup(self) -> None:
        if self.prepuller is not None:
            await self.prepuller.close()
        names = [self.pools.pop(i) for i in list(self.pools)] + sorted(self.unconfirmed)
        for name in names:
            try:
                await self.pm.delete(name)
            except (ApiError, OSError, TimeoutError) as e:
                log.warning("pool cleanup: %s", e)
        self.unconfirmed.clear()
        for s in self.state:
            while s.idle:
                await self._release(s.idle.pop())
