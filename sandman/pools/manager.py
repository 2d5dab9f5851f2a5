"""Sizes warm pools to demand under one create budget (the pool manager).

The manager is the only writer of its pools' ``spec.replicas``. What it last
wrote is its expectation of how many pods each ReplicaSet will hold, so a
stale watch cache can never make it create twice: it does not count pods to
decide how many to add, it raises replicas by the tokens it was granted, and
every write carries a ``test`` on the replicas it expects (someone scaling the
pool by hand makes the write fail and the manager re-reads).

Every pod a pool creates costs a token from one CreateLimiter shared with
on-demand creates, which go first. A claim normally lets the ReplicaSet
refill (a token is charged for it); when no token is free, or demand has
fallen, the claim is followed by a scale-down so the refill waits.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from sandman.clock import utc_now
from sandman.contract import (
    LABEL_CLAIM,
    LABEL_POOL,
    LABEL_STATE,
    REASON_POOL_FAILING,
    REASON_POOL_RECOVERED,
    format_time,
)
from sandman.events import EventRecorder, ObjectRef
from sandman.informer import Informer
from sandman.kube_async import (
    JSON_PATCH,
    PODS,
    REPLICASETS,
    ApiError,
    KubeClient,
    escape_pointer,
    sleep_or,
)
from sandman.pools.claim import ClaimResult, NoIdlePod, claim, leave_pool
from sandman.pools.decide import AfterClaim, after_claim, keep_waiting, two_phase_claim
from sandman.pools.health import FAILING, PoolHealth, is_expired, is_restarted, pool_health
from sandman.pools.limiter import CreateLimiter
from sandman.pools.spec import ANN_POOL_STATUS, STATE_IDLE, PoolSpec, replicaset_name
from sandman.pools.warm import dry_run_pod
from sandman.telemetry import Telemetry

log = logging.getLogger(__name__)


def pod_name(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", "?"))


PodHook = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class ManagerConfig:
    # Pod creates/s for pools and on-demand together. 20/s is client-go's
    # default QPS, which kube-controller-manager keeps unless told otherwise
    # (--kube-api-qps 20): the ReplicaSet controller makes every pool pod, so
    # in such a cluster a larger budget only queues inside the controller
    # manager, behind every other controller. It is also most of what one
    # client gets here: `sandman bench cluster` measured 25.6 creates/s (16
    # client threads, shared 2-core machine at load 6-8). Cost: a batch of N
    # new pods takes at least N/20 s (800 pods: 40 s, docs/pools.md); raise it
    # with the controller manager's QPS on a cluster that has the headroom.
    create_rate: float = 20.0
    # One second's worth at once: a fleet's first wave starts without a ramp.
    create_burst: int = 20
    tick_s: float = 0.25  # reconcile at least this often (also woken by changes)
    status_every_s: float = 5.0  # status annotation writes, per pool, at most this often


@dataclass
class ManagerStats:
    pool_pods_created: int = 0  # pods of our pools first seen after we started
    on_demand_created: int = 0
    claims: int = 0
    claim_conflicts: int = 0
    refills_charged: int = 0  # claims the ReplicaSet refilled at once
    refills_deferred: int = 0  # claims followed by a scale-down
    refills_avoided: int = 0  # two-phase claims: scaled down before leaving the pool
    scale_writes: int = 0
    scale_conflicts: int = 0  # someone else changed replicas; re-read
    reconciles: int = 0  # passes of the reconcile loop (each looks at every pool)


@dataclass
class _Pool:
    spec: PoolSpec
    target: int
    replicas: int  # last written (the expectation)
    rs: dict[str, Any]
    health: PoolHealth = field(default_factory=PoolHealth)
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # a pod of it changed
    # One replicas write at a time: each is a JSON patch tested against the
    # last written value, so two in flight (two claims settling) made the
    # second fail its test, and a two-phase claim that lost its scale-down
    # still left the pool: the ReplicaSet refilled its place (CI, 2026-12-01).
    scaling: asyncio.Lock = field(default_factory=asyncio.Lock)
    status_written: tuple[float, str] = (0.0, "")


class PoolManager:
    """Use as ``async with PoolManager(kube, ns) as pm``. Event-loop only."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        config: ManagerConfig | None = None,
        *,
        on_pod: PodHook | None = None,
        component: str = "sandman-pools",
        telemetry: Telemetry | None = None,
    ) -> None:
        self.kube, self.namespace = kube, namespace
        self.config = config or ManagerConfig()
        self.limiter = CreateLimiter(self.config.create_rate, self.config.create_burst)
        self.stats = ManagerStats()
        self.events = EventRecorder(kube, component)
        self._on_pod = on_pod
        # Claim latency and the create budget on the SDK's metrics endpoint, if any.
        self._metrics = telemetry.metrics if telemetry is not None else None
        self._pools: dict[str, _Pool] = {}
        self._seen: set[str] = set()
        # Pods by pool, kept by the informer's handler: health and claims look
        # at one pool on every pod event, not at every pool pod of the namespace.
        self._by_pool: dict[str, dict[str, dict[str, Any]]] = {}
        # UIDs this manager's claims are trying or won (``claim(reserved=)``):
        # concurrent claims take different pods instead of racing each other.
        self._claiming: set[str] = set()
        self._started = format_time(utc_now())
        self._informer = Informer(
            kube, PODS, self._pod_event, namespace=namespace, label_selector=LABEL_POOL
        )
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()  # claims being settled

    # -- lifecycle -------------------------------------------------------------
    async def __aenter__(self) -> PoolManager:
        self._tasks = [
            asyncio.create_task(self._informer.run(self._stop)),
            asyncio.create_task(self.events.run(self._stop)),
            asyncio.create_task(self._reconcile_loop()),
        ]
        await self._informer.synced.wait()
        if self._metrics is not None:
            self._metrics.watch(self)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._metrics is not None:
            self._metrics.forget(self)
        if self._background:  # claims still leaving their pools: let them finish
            await asyncio.gather(*list(self._background), return_exceptions=True)
        self._stop.set()
        self._wake.set()
        self.limiter.close()
        self._tasks[0].cancel()  # the informer sits in a long watch; nothing to flush
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- pools -----------------------------------------------------------------
    async def ensure(self, spec: PoolSpec) -> None:
        """Create the pool's ReplicaSet (as large as the budget allows now; the
        manager grows it) or adopt an existing one."""
        name = replicaset_name(spec.name)
        # Admission ahead of the pods (before taking create tokens): warms the
        # webhook's image cache, and a pod the webhook would refuse fails here
        # (PoolRefused), with its reason.
        await dry_run_pod(self.kube, spec, self.namespace)
        # Start with what the budget allows right now, so that a claim made a
        # moment later already finds pods on their way (the loop grows the rest).
        first = 0
        while first < spec.size and self.limiter.try_refill():
            first += 1
        try:
            rs = await self.kube.create(
                REPLICASETS, spec.replicaset(replicas=first), self.namespace
            )
        except ApiError as e:
            if not e.conflict:
                raise
            rs = await self.kube.get(REPLICASETS, name, self.namespace)
            have = rs["spec"]["template"]["spec"]["containers"][0]["image"]
            if have != spec.image:
                raise ValueError(
                    f"pool {spec.name} exists with image {have}, not {spec.image}; "
                    "delete it or use another pool name"
                ) from None
        self._pools[spec.name] = _Pool(spec, spec.size, int(rs["spec"]["replicas"]), rs)
        self._refresh_health(spec.name)
        self._wake.set()

    def set_target(self, pool: str, idle: int) -> None:
        """How many idle pods the pool should hold (its demand)."""
        self._pools[pool].target = max(0, idle)
        self._wake.set()

    async def delete(self, pool: str) -> None:
        """Delete the pool: its idle pods go with it; claimed pods are not its own."""
        p = self._pools.pop(pool, None)
        try:
            await self.kube.delete(
                REPLICASETS,
                replicaset_name(pool),
                self.namespace,
                uid=p.rs["metadata"]["uid"] if p else None,
                propagation_policy="Background",
            )
        except ApiError as e:
            if not (e.not_found or e.conflict):
                raise

    def health(self, pool: str) -> PoolHealth:
        return self._pools[pool].health

    def _idle_seen(self, pool: str) -> int:
        return sum(
            1
            for pod in self.pods(pool)
            if pod["metadata"].get("labels", {}).get(LABEL_STATE) == STATE_IDLE
            and not pod["metadata"].get("deletionTimestamp")
        )

    def pods(self, pool: str) -> list[dict[str, Any]]:
        return list(self._by_pool.get(pool, {}).values())

    # -- claims and on-demand creates ------------------------------------------
    async def claim(
        self,
        pool: str,
        *,
        claimer: str,
        ttl: dt.timedelta,
        ready_only: bool = False,
        wait_s: float = 0.0,
    ) -> ClaimResult:
        """``_claim``, timed for the metrics endpoint when there is one."""
        if self._metrics is None:
            return await self._claim(
                pool, claimer=claimer, ttl=ttl, ready_only=ready_only, wait_s=wait_s
            )
        t0, result = time.monotonic(), "error"
        try:
            res = await self._claim(
                pool, claimer=claimer, ttl=ttl, ready_only=ready_only, wait_s=wait_s
            )
            result = "ok"
            return res
        except NoIdlePod:
            result = "no_idle"
            raise
        finally:
            self._metrics.claim_done(result, time.monotonic() - t0)

    async def _claim(
        self,
        pool: str,
        *,
        claimer: str,
        ttl: dt.timedelta,
        ready_only: bool = False,
        wait_s: float = 0.0,
    ) -> ClaimResult:
        """Claim from the cache's candidates, then decide the refill
        (``sandman.pools.decide`` makes each decision; this does the I/O).

        With ``wait_s``, a pool that is growing (replicas written, pods not
        seen yet) is waited on that long before NoIdlePod: its next pod is as
        far along as a new one would be, and creating both wastes one.
        """
        p = self._pools.get(pool)
        if p is None:
            raise NoIdlePod(f"pool {pool} is not (or no longer) managed here")
        deadline = time.monotonic() + wait_s
        while True:
            two_phase = two_phase_claim(
                p.target, p.replicas, p.health.starting, p.health.failing, ready_only
            )
            try:
                res = await claim(
                    self.kube,
                    self.namespace,
                    pool,
                    claimer=claimer,
                    ttl=ttl,
                    candidates=self.pods(pool),
                    ready_only=ready_only,
                    leave=not two_phase,
                    reserved=self._claiming,
                )
                break
            except NoIdlePod:
                left = deadline - time.monotonic()
                if pool not in self._pools or not keep_waiting(
                    left, p.replicas, self._idle_seen(pool)
                ):
                    raise
                p.changed.clear()
                await sleep_or(p.changed, left)
        self.stats.claims += 1
        self.stats.claim_conflicts += res.conflicts
        managed = pool in self._pools  # it may have been deleted while we claimed
        plan = after_claim(p.target, p.replicas, two_phase=two_phase)
        if managed:
            p.target = plan.target
        # The claimer has its pod (held, leased, kept from the ReplicaSet and
        # the garbage collector by the webhook); the pool's side follows.
        self._background_task(self._settle(pool, res.pod, plan, two_phase, managed))
        return res

    def _background_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _settle(
        self, pool: str, pod: dict[str, Any], plan: AfterClaim, two_phase: bool, managed: bool
    ) -> None:
        """The writes a claim makes after its winning one, off the claimer's path.

        A claim used to return only after them: three serial writes for a
        two-phase claim, two through the validating webhook, measured at
        0.9 s p50 per warm claim inside a fleet on the loaded 2-core machine
        (docs/pools.md). Same writes, same order, same decisions (made at
        claim time, as before); only the claimer no longer waits (which
        also lets a two-phase claim wait for the controller before leaving).
        """
        try:
            if two_phase:
                # MUST scale down before the pod leaves, and the ReplicaSet
                # controller MUST have seen it: its pick is then the held pod
                # (refused), and no refill is created. Its pod and ReplicaSet
                # caches are separate watches, so the pod's leaving can reach
                # it first: with only our write done, it refilled (CI, 2026-12-01).
                if managed:
                    self.stats.refills_avoided += 1
                    await self._shrink_to(pool, plan.scale_to)
                    await self._observed(pool)
                try:
                    await leave_pool(self.kube, self.namespace, pod)
                except ApiError as e:
                    if not e.not_found:  # released (deleted) by its claimer already
                        raise
                return
            if not managed:
                return
            if plan.refill_if_token and self.limiter.try_refill():
                self.stats.refills_charged += 1
            else:
                self.stats.refills_deferred += 1
                await self._shrink_to(pool, plan.scale_to)
        except (ApiError, OSError, TimeoutError) as e:
            log.warning("pool %s: settling the claim of %s: %s", pool, pod_name(pod), e)
        finally:
            self._wake.set()

    async def create_pod(self, body: dict[str, Any], namespace: str | None = None) -> Any:
        """Create a pod on demand: same budget as the pools, served first."""
        await self.limiter.acquire()
        pod = await self.kube.create(PODS, body, namespace or self.namespace)
        self.stats.on_demand_created += 1
        return pod

    # -- the loop ---------------------------------------------------------------
    async def _reconcile_loop(self) -> None:
        turn = 0
        while not self._stop.is_set():
            await sleep_or(self._wake, self.config.tick_s)
            self._wake.clear()
            try:
                await self._reconcile(turn)
            except (ApiError, OSError, TimeoutError) as e:
                log.warning("pool reconcile failed: %s", e)
            turn += 1
            self.stats.reconciles += 1

    async def _reconcile(self, turn: int) -> None:
        names = list(self._pools)
        if not names:
            return
        names = names[turn % len(names) :] + names[: turn % len(names)]  # fair start
        grants = dict.fromkeys(names, 0)
        for name in names:
            p = self._pools[name]
            if p.target < p.replicas:
                await self._shrink_to(name, p.target, attempts=1)
        # Each token goes to the wanting pool that holds the fewest pods, so
        # one big pool cannot starve the others of the shared budget (ties go
        # by the rotating order).
        wanting = [n for n in names if self._wants(n)]
        while wanting:
            name = min(wanting, key=lambda n: self._pools[n].replicas + grants[n])
            if not self.limiter.try_refill():
                break
            grants[name] += 1
            p = self._pools[name]
            if p.replicas + grants[name] >= p.target:
                wanting.remove(name)
        for name, n in grants.items():
            if n and name in self._pools:
                await self._scale(name, lambda now, n=n: now + n)
        now = time.monotonic()
        for name in names:
            if name in self._pools:
                await self._recycle(name)
                await self._publish_status(name, now)

    async def _recycle(self, pool: str) -> None:
        """Delete the pool's own idle pods that died of old age (the
        ReplicaSet has replaced them already but leaves the Failed pods
        behind; nobody else would clean them up) or whose container restarted
        (no claim takes them, and the ReplicaSet would keep them forever)."""
        for pod in self.pods(pool):
            md = pod["metadata"]
            if md.get("deletionTimestamp") or not (is_expired(pod) or is_restarted(pod)):
                continue
            if md.get("labels", {}).get(LABEL_STATE) != STATE_IDLE:
                continue
            try:
                await self.kube.delete(
                    PODS, md["name"], self.namespace, uid=md["uid"], resource_version=None
                )
            except ApiError as e:
                if not (e.not_found or e.conflict):
                    raise

    def _wants(self, name: str) -> bool:
        p = self._pools[name]
        # A failing pool stays as it is: more pods would fail the same way.
        return p.target > p.replicas and p.health.condition != FAILING

    async def _shrink_to(self, pool: str, replicas: int, *, attempts: int = 3) -> None:
        """Bring the pool down to ``replicas`` if it is above; never up.

        A claim's scale-down is tried again after a conflict (someone else
        wrote the ReplicaSet): lost, the claimed pod's place would be refilled.
        """
        for _ in range(attempts):
            if await self._scale(pool, lambda now: min(now, replicas)):
                return

    async def _observed(self, pool: str, timeout_s: float = 5.0) -> None:
        """Wait until the ReplicaSet controller has acted on our last write
        (``status.observedGeneration``); on timeout, go on (logged): the
        worst case is one refill, which the pool's loop scales away."""
        p = self._pools.get(pool)
        if p is None:
            return
        want = int(p.rs["metadata"].get("generation", 0))
        deadline, pause = time.monotonic() + timeout_s, 0.01
        rs = p.rs
        while int(rs.get("status", {}).get("observedGeneration", 0)) < want:
            if time.monotonic() > deadline:
                log.warning("pool %s: generation %d not observed in %.0fs", pool, want, timeout_s)
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.2)
            try:
                rs = await self.kube.get(REPLICASETS, replicaset_name(pool), self.namespace)
            except ApiError as e:
                if e.not_found:
                    return
                raise

    async def _scale(self, pool: str, to: Callable[[int], int]) -> bool:
        """Write ``to(last written replicas)``, one write per pool at a time.
        False when the write lost to another writer (the value is re-read)."""
        p = self._pools.get(pool)
        if p is None:
            return True
        async with p.scaling:
            replicas = max(0, to(p.replicas))
            if replicas == p.replicas or pool not in self._pools:
                return True
            return await self._write_replicas(pool, p, replicas)

    async def _write_replicas(self, pool: str, p: _Pool, replicas: int) -> bool:
        patch = [
            {"op": "test", "path": "/spec/replicas", "value": p.replicas},
            {"op": "replace", "path": "/spec/replicas", "value": replicas},
        ]
        self.stats.scale_writes += 1
        try:
            p.rs = await self.kube.patch(
                REPLICASETS, replicaset_name(pool), patch, self.namespace, content_type=JSON_PATCH
            )
        except ApiError as e:
            if e.not_found:  # the pool was deleted meanwhile
                return True
            if e.status not in (409, 422):
                raise
            self.stats.scale_conflicts += 1
            try:
                p.rs = await self.kube.get(REPLICASETS, replicaset_name(pool), self.namespace)
            except ApiError as again:
                if again.not_found:  # deleted between the write and the re-read
                    return True
                raise
            p.replicas = int(p.rs["spec"]["replicas"])
            return False
        p.replicas = int(p.rs["spec"]["replicas"])
        return True

    # -- pods, health, status ---------------------------------------------------
    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        md = pod["metadata"]
        pool = md.get("labels", {}).get(LABEL_POOL, "")
        members = self._by_pool.setdefault(pool, {})
        if kind == "DELETED":
            members.pop(md["name"], None)
        else:
            members[md["name"]] = pod
        labels = md.get("labels") or {}
        if kind == "DELETED" or labels.get(LABEL_STATE) != STATE_IDLE or labels.get(LABEL_CLAIM):
            self._claiming.discard(md["uid"])  # the cache has caught up with the claim
        if kind == "ADDED" and md["uid"] not in self._seen:
            self._seen.add(md["uid"])
            if pool in self._pools and md.get("creationTimestamp", "") >= self._started:
                self.stats.pool_pods_created += 1
        if self._on_pod is not None:
            self._on_pod(kind, pod)
        if pool in self._pools:
            self._refresh_health(pool)
            self._pools[pool].changed.set()
            self._wake.set()

    def _refresh_health(self, pool: str) -> None:
        p = self._pools[pool]
        before = p.health.condition
        p.health = pool_health(self.pods(pool))
        after = p.health.condition
        if after == FAILING and before != FAILING:
            self.events.emit(
                ObjectRef.of(p.rs, "ReplicaSet", "apps/v1"),
                REASON_POOL_FAILING,
                f"pool {pool}: {p.health.failing} pod(s) cannot start "
                f"({', '.join(p.health.reasons)}): {p.health.message}; "
                "the pool stops growing until one becomes Ready",
                "Warning",
            )
        elif before == FAILING and after != FAILING:
            self.events.emit(
                ObjectRef.of(p.rs, "ReplicaSet", "apps/v1"),
                REASON_POOL_RECOVERED,
                f"pool {pool}: pods start again ({p.health.ready} ready)",
            )

    async def _publish_status(self, pool: str, now: float) -> None:
        """The pool's health as an annotation on its ReplicaSet (no CRD, so no status)."""
        p = self._pools[pool]
        doc = json.dumps(
            {**p.health.to_json(), "target": p.target, "replicas": p.replicas}, sort_keys=True
        )
        last_t, last_doc = p.status_written
        if doc == last_doc or now - last_t < self.config.status_every_s:
            return
        patch = [
            {
                "op": "add",
                "path": "/metadata/annotations/" + escape_pointer(ANN_POOL_STATUS),
                "value": doc,
            }
        ]
        try:
            p.rs = await self.kube.patch(
                REPLICASETS, replicaset_name(pool), patch, self.namespace, content_type=JSON_PATCH
            )
        except ApiError as e:
            if not e.not_found:
                raise
        p.status_written = (now, doc)
