"""`sandman eval run`: every task of a spec, in fresh sandboxes, under the
controlled conditions, with infrastructure failures retried and never scored.

Order of a run: pin the images (``pins.resolve``, once), decide where the
sandboxes go (``placement``: a dry run of the task pods and the nodes; a run
that cannot be placed as asked is refused here, before anything is created),
check the offline NetworkPolicies (``network.ensure_offline``), write
``run.json``, then run
(task, repeat) pairs at the given concurrency, each attempt in a new sandbox
(``attempt.Runner``), appending each finished task's line as it lands, and
end with the results in spec order and the summary. A run resumed in the same
directory keeps its pins and its finished lines and runs only the rest.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sandman import __version__
from sandman.client import SandmanClient
from sandman.client.sandbox import build_pod
from sandman.clock import utc_now
from sandman.contract import format_time
from sandman.eval import attempt as attempt_mod
from sandman.eval import canary, decide, network, pins, placement
from sandman.eval.results import Key, ResultsDir, RunExists, finished, task_record
from sandman.eval.spec import Spec, Task
from sandman.eval.summary import render_text, summarize
from sandman.kube_async import NODES, PODS, ApiError
from sandman.oci import ImageNotFound, RegistryError
from sandman.registry import Keychain, RegistryClient


class SpecChanged(Exception):
    """A resumed run's spec is not the spec the run started with."""


@dataclass(frozen=True)
class Options:
    namespace: str
    concurrency: int = 4
    attempts: int = 3  # per task, infrastructure failures included
    repeat: int = 1
    profile: str = "eval"
    start_timeout_s: float = 300.0
    resume: bool = False
    # Run offline tasks even where the canary cannot show the network is off
    # (canary.py); the run records network: unverified.
    allow_unverified_network: bool = False
    # Refuse the run unless every task can have a node dedicated to the
    # profile (placement.py); without it a run with none runs on shared nodes
    # and records so.
    require_dedicated: bool = False
    # Look at the nodes before the run (off: nodes an autoscaler adds on
    # demand, which a preflight would find missing).
    check_nodes: bool = True


@dataclass
class Hooks:
    """Test and progress hooks (all optional)."""

    after_resolve: Callable[[Mapping[str, pins.Pin]], Awaitable[None]] | None = None
    before_phase: attempt_mod.Hook | None = None
    on_record: Callable[[dict[str, Any]], None] | None = None


@dataclass
class RunResult:
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    text: str
    run: dict[str, Any] = field(default_factory=dict)


class EvalRun:
    """One run of a spec into one results directory.

    Exists so that no result can claim conditions nobody checked, and no hole
    can pass for a score: pins, the network check and the per-task checks
    happen here or in ``attempt``, and every exception of a task ends in a
    classified record (a crash of the runner itself still leaves the lines
    already appended, which ``--resume`` keeps). Use once; safe for the
    concurrent tasks it starts on one event loop, not across threads.
    """

    def __init__(
        self,
        client: SandmanClient,
        spec: Spec,
        out: ResultsDir,
        options: Options,
        *,
        registry: RegistryClient | None = None,
        keychain: Keychain | None = None,
        hooks: Hooks | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = utc_now,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if options.attempts < 1 or options.repeat < 1 or options.concurrency < 1:
            raise ValueError("attempts, repeat and concurrency must be at least 1")
        self.client, self.spec, self.out, self.opts = client, spec, out, options
        self._own_registry = registry is None
        self.registry = registry or RegistryClient()
        self.keychain = keychain
        self.hooks = hooks or Hooks()
        self.clock, self.wall, self.sleep = clock, wall, sleep
        self._nodes: dict[str, tuple[dict[str, Any] | None, int]] = {}  # name -> (node, HTTP error)
        self.preflight: placement.Preflight | None = None
        self.run_doc: dict[str, Any] = {}
        self.pins: dict[str, pins.Pin] = {}
        self.network = canary.NetworkCheck(options.allow_unverified_network)

    # -- preparation -----------------------------------------------------------
    async def _prepare(self) -> dict[Key, dict[str, Any]]:
        done: dict[Key, dict[str, Any]] = {}
        if self.out.has_run():
            if not self.opts.resume:
                raise RunExists(
                    f"{self.out.root} holds a run already: pass --resume to finish it, "
                    "or choose another output directory"
                )
            doc = self.out.load_run()
            if doc.get("spec_digest") != self.spec.digest:
                raise SpecChanged(
                    f"{self.out.root}: the spec changed since this run started "
                    f"({doc.get('spec_digest')} -> {self.spec.digest}); start a new run"
                )
            if int(doc.get("repeat", 1)) != self.opts.repeat:
                raise SpecChanged(f"{self.out.root}: the run was started with --repeat "
                                  f"{doc.get('repeat')}; resume it with the same")  # fmt: skip
            self.run_doc = doc
            self.pins = {r: pins.Pin(**p) for r, p in (doc.get("pins") or {}).items()}
            done = {k: r for k, r in self.out.records().items() if finished(r)}
        else:
            self.run_doc = {"run_id": secrets.token_hex(6), "started_at": format_time(self.wall())}
        # Tags are resolved once per run: kept pins stay; only what never resolved is tried again.
        missing = {t.image for t in self.spec.tasks} - {
            r for r, p in self.pins.items() if p.digest is not None
        }
        if missing:
            self.pins.update(
                await pins.resolve(
                    self.registry,
                    missing,
                    attempts=self.opts.attempts,
                    keychain=self.keychain,
                    sleep=self.sleep,
                )
            )
        # Before anything is created (the offline policies included).
        self.preflight = await self._preflight()
        if self.preflight.verdict == placement.REFUSED:
            raise placement.PlacementRefused(self.preflight.message())
        net = None
        if any(not t.network for t in self.spec.tasks):
            net = await network.ensure_offline(self.client.kube, self.opts.namespace)
        self.run_doc.update(
            spec=self.spec.name,
            spec_digest=self.spec.digest,
            namespace=self.opts.namespace,
            options={k: v for k, v in asdict(self.opts).items() if k != "resume"},
            repeat=self.opts.repeat,
            pins={r: asdict(p) for r, p in sorted(self.pins.items())},
            network=net,
            placement=self.preflight.record(),
            versions={"sandman_runner": __version__, "kubernetes": await self._server_version()},
        )
        self.out.write_run(self.run_doc)
        if self.hooks.after_resolve is not None:
            await self.hooks.after_resolve(self.pins)
        return done

    async def _server_version(self) -> str | None:
        try:
            doc = await self.client.kube.request("GET", "/version")
        except ApiError:
            return None
        return str(doc.get("gitVersion")) if isinstance(doc, dict) else None

    async def _preflight(self) -> placement.Preflight:
        """Where the run's pods can go: the webhook's answer for each distinct
        task size (a server-side dry run: nothing is created) against the nodes."""
        probes: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        for t in self.spec.tasks:
            pin = self.pins.get(t.image)
            if pin is not None and pin.digest is not None and t.resources not in probes:
                args = attempt_mod.pod_args(t, run_id=self.run_doc["run_id"],
                                            profile=self.opts.profile,
                                            start_timeout_s=self.opts.start_timeout_s)  # fmt: skip
                probes[t.resources] = build_pod(
                    pin.image, name=None, idle_timeout=None, workspace=None, annotations={},
                    tolerations=None, **args,
                )  # fmt: skip
        placements = []
        for body in probes.values():
            try:
                pod = await self.client.kube.create(PODS, body, self.opts.namespace, dry_run="All")
            except ApiError:
                # Refused (policy, quota) or admission down: the task's own
                # attempt meets the same answer and records it as its reason.
                continue
            placements.append(placement.Placement.of_pod(pod))
        nodes, error = None, f"{placement.SKIP_FLAG} was given"
        if self.opts.check_nodes:
            try:
                items = (await self.client.kube.list(NODES)).get("items") or []
                nodes = [placement.Node.of(n) for n in items]
            except ApiError as e:
                error = f"listing them failed: HTTP {e.status}"
        return placement.decide(
            self.opts.profile, placements, nodes,
            require_dedicated=self.opts.require_dedicated, nodes_error=error,
        )  # fmt: skip

    async def _node(self, name: str) -> tuple[dict[str, Any] | None, int]:
        if name not in self._nodes:
            try:
                self._nodes[name] = (await self.client.kube.get(NODES, name), 0)
            except ApiError as e:  # no RBAC on nodes: the node's name is still recorded
                self._nodes[name] = (None, e.status)
        return self._nodes[name]

    async def _node_info(self, name: str) -> dict[str, Any]:
        node, status = await self._node(name)
        if node is None:
            return {"node_info": f"unreadable (HTTP {status})"}
        info = (node.get("status") or {}).get("nodeInfo") or {}
        return {
            "kubelet": info.get("kubeletVersion"),
            "container_runtime": info.get("containerRuntimeVersion"),
            "kernel": info.get("kernelVersion"),
            "os_image": info.get("osImage"),
        }

    async def _node_dedicated(self, name: str, pod: Mapping[str, Any]) -> bool | None:
        """Whether the node a task ran on is dedicated to the profile; where
        nodes cannot be read, what the pod's nodeSelector guarantees (the label)."""
        node, _ = await self._node(name)
        if node is not None:
            return not placement.dedication_gaps(placement.Node.of(node), self.opts.profile)
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        return True if selector.get(placement.DEDICATED_KEY) == self.opts.profile else None

    # -- running -----------------------------------------------------------------
    async def run(self) -> RunResult:
        try:
            return await self._run()
        finally:
            if self._own_registry:
                await self.registry.close()

    async def _run(self) -> RunResult:
        done = await self._prepare()
        settings = attempt_mod.Settings(
            client=self.client,
            namespace=self.opts.namespace,
            run_id=self.run_doc["run_id"],
            profile=self.opts.profile,
            start_timeout_s=self.opts.start_timeout_s,
            node_info=self._node_info,
            hook=self.hooks.before_phase,
            clock=self.clock,
            network=self.network,
            node_selector=self.preflight.pin if self.preflight else {},
            placement=self.preflight.record() if self.preflight else {},
            require_dedicated=self.opts.require_dedicated,
            node_dedicated=self._node_dedicated,
        )
        runner = attempt_mod.Runner(settings)
        gate = asyncio.Semaphore(self.opts.concurrency)
        records: dict[Key, dict[str, Any]] = dict(done)

        async def one(task: Task, repeat: int) -> None:
            async with gate:
                rec = await self._task(runner, task, repeat)
            records[(task.id, repeat)] = rec
            self.out.append(rec)
            if self.hooks.on_record is not None:
                self.hooks.on_record(rec)

        todo = [
            (t, r)
            for r in range(self.opts.repeat)
            for t in self.spec.tasks
            if (t.id, r) not in done
        ]
        await asyncio.gather(*(one(t, r) for t, r in todo))
        ordered = [records[(t.id, r)] for t in self.spec.tasks for r in range(self.opts.repeat)]
        self.out.rewrite(ordered)
        summary = summarize(ordered, max_attempts=self.opts.attempts)
        text = render_text(summary, ordered)
        self.out.write_summary(summary, text)
        self.run_doc["finished_at"] = format_time(self.wall())
        self.network.finish()
        if self.run_doc.get("network") is not None:
            self.run_doc["network"] = {**self.run_doc["network"], **self.network.record}
        self.out.write_run(self.run_doc)
        self.network.raise_if_refused()  # after the results: the holes say why
        return RunResult(ordered, summary, text, self.run_doc)

    async def _task(self, runner: attempt_mod.Runner, task: Task, repeat: int) -> dict[str, Any]:
        pin = self.pins[task.image]
        started = format_time(self.wall())
        base = {"task": task.id, "repeat": repeat, "image": task.image, "digest": pin.digest}
        if pin.digest is None:
            return task_record(**base, status=decide.INFRA, reason=pin.reason,
                               message=f"{task.image} could not be pinned: {pin.error}",
                               attempts=pin.attempts, retries=[], started_at=started,
                               finished_at=format_time(self.wall()))  # fmt: skip
        retries: list[dict[str, Any]] = []
        for n in range(1, self.opts.attempts + 1):
            a = attempt_mod.Attempt(task, repeat, n, self.out.attempt_logs(task.id, repeat, n))
            logs = str(a.logs.relative_to(self.out.root))
            try:
                await self._check_pin(pin)
                outcome = await runner.run(a, pin)
                status, reason, message, detail = outcome.status, outcome.reason, "", outcome.detail
            except decide.TaskBroken as e:
                status, reason, message, detail = decide.ERROR, e.reason, str(e), {}
            except Exception as e:  # every failure is classified, none is lost
                f = decide.classify(e) or decide.Failure(type(e).__name__, str(e), False)
                if decide.retry(f, n, self.opts.attempts):
                    retries.append({"attempt": n, "phase": a.phase, "reason": f.reason,
                                    "message": f.message[:1000], "logs": logs})  # fmt: skip
                    await self.sleep(decide.retry_backoff_s(n))
                    continue
                status, reason, message = decide.INFRA, f.reason, f.message
                detail = {"phase": a.phase, "retryable": f.retryable}
            return task_record(
                **base, status=status, reason=reason, message=message, detail=detail,
                attempts=n, retries=retries, phases=a.phases, conditions=a.conditions,
                versions={**a.versions, **self.run_doc["versions"]}, tails=a.tails,
                logs=logs, started_at=started, finished_at=format_time(self.wall()),
            )  # fmt: skip
        raise AssertionError("unreachable: the last attempt returns")

    async def _check_pin(self, pin: pins.Pin) -> None:
        try:
            now = await pins.still_pinned(self.registry, pin, keychain=self.keychain)
        except ImageNotFound:
            raise decide.TagMoved(
                f"{pin.ref} no longer exists (the run pinned {pin.digest}); "
                "the run refuses a tag that moved"
            ) from None
        except RegistryError as e:
            raise decide.EvalInfraError(
                str(e), reason=type(e).__name__, retryable=e.retryable
            ) from None
        if now is not None:
            raise decide.TagMoved(
                f"{pin.ref} moved from {pin.digest} (pinned at the run's start) to {now}; "
                "the run refuses a tag that moved (start a new run to pin the new content)"
            )
