"""The reaper: a watch-driven controller that reclaims sandboxes whose lease ended.

Flow (the TTL-after-finished controller's, with Sandman's reasons): an
informer on labeled pods computes each sandbox's next deadline and queues its
key for exactly then (no sweep loop). A worker takes a due key, re-reads the
pod from the API (the cache may be stale), decides again on the fresh copy,
and only then, within the delete rate limit and while leader, writes an Event
with the reason and deletes with UID + resourceVersion preconditions: if the
pod changed meanwhile (a client extended its lease), the delete fails with
409, and the key is re-queued to be decided on the newer object. NotFound is
success. A pod without the sandbox label is never deleted.

Two gates come first (``trust.py``, ``outage.py``): a pod in a system
namespace, or without a valid admission marker, is never acted on (the label
alone proves nothing); and a lease that ended while the admission webhook
could not admit extensions is held until the webhook has been back for the
extension grace.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from sandman.clock import utc_now
from sandman.contract import (
    LABEL_SANDBOX,
    REASON_KEY_RETIRED,
    REASON_LEASE_EXPIRED,
    REASON_LEASE_HELD,
    REASON_UNVERIFIED,
    ContractError,
    is_sandbox,
    parse_time,
)
from sandman.events import EventRecorder, ObjectRef
from sandman.informer import Informer, key_of
from sandman.kube_async import PODS, ApiError, KubeClient
from sandman.leader import LeaderElector
from sandman.ratelimit import TokenBucket
from sandman.reaper.cache import cached_view
from sandman.reaper.decide import REASON_IDLE, Decision, StuckLimits, decide, idle_timeout
from sandman.reaper.idle import IDLE_UNSUPPORTED, IdleTracker, poll_idle_seconds
from sandman.reaper.metrics import ReaperMetrics
from sandman.reaper.outage import DEFAULT_GRACE, AdmissionHealth
from sandman.reaper.trust import Trust, trust
from sandman.reaper.workqueue import DelayQueue
from sandman.tokens import AdmissionKeys

log = logging.getLogger("sandman.reaper")

# While a daemon fails to answer, ask again this often (capped by a quarter of
# its idle timeout): enough tries that one blip is outvoted before the
# timeout passes, few enough to cost nothing.
UNREACHABLE_RETRY = dt.timedelta(seconds=30)
# While a lease is held for a webhook outage, look again this often (the
# webhook probe's own period: nothing new is known sooner).
HELD_RETRY = dt.timedelta(seconds=5)


@dataclass
class ReaperOptions:
    dry_run: bool = False
    # 50 deletes/s sustained, 200 in a burst: a 10,000-sandbox fleet whose
    # leases end together drains in ~3 min without saturating the apiserver's
    # default mutating inflight limit (200) that running jobs also need.
    delete_qps: float = 50.0
    delete_burst: int = 200
    # Reclaims in flight. Each is a GET, a DELETE and an Event, ~0.8 s on a
    # loaded apiserver (docs/scale.md): 8 workers gave 8-12 reclaims/s, far
    # under delete_qps. 32 reach 40/s at 0.8 s and the token bucket, not the
    # workers, sets the rate; idle workers cost one waiting task each.
    workers: int = 32
    stuck: StuckLimits = field(default_factory=StuckLimits)
    extension_grace: dt.timedelta = DEFAULT_GRACE  # outage.py; 0 holds nothing


class Reaper:
    """Not thread-safe; runs on one event loop. Safe with a standby replica:
    only the elected leader deletes, and it checks before every delete."""

    def __init__(
        self,
        client: KubeClient,
        options: ReaperOptions,
        metrics: ReaperMetrics,
        *,
        elector: LeaderElector | None,
        recorder: EventRecorder | None,
        keys: AdmissionKeys | None = None,
        health: AdmissionHealth | None = None,
        clock: Callable[[], dt.datetime] = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
        namespace: str | None = None,
    ) -> None:
        """``keys``: the admission keys (None until read: nothing is acted on);
        ``health``: the webhook's availability (None: no lease is ever held)."""
        self.client = client
        self.options = options
        self.metrics = metrics
        self.elector = elector
        self.recorder = recorder
        self.keys = keys
        self.health = health
        self.clock = clock
        self.monotonic = monotonic
        self.queue = DelayQueue(monotonic)
        self.bucket = TokenBucket(options.delete_qps, options.delete_burst, monotonic)
        self.idle = IdleTracker()
        self.informer = Informer(
            client,
            PODS,
            self._on_event,
            namespace=namespace,
            label_selector=f"{LABEL_SANDBOX}=true",
            keep=cached_view,  # what decide/trust/the inventory read (reaper/cache.py)
        )
        self.reported: dict[str, str] = {}  # key -> reason already reported (no delete)
        self.http: aiohttp.ClientSession | None = None

    # -- scheduling -----------------------------------------------------------
    def _at(self, when: dt.datetime) -> float:
        """A wall-clock deadline as a point on the queue's monotonic clock."""
        return self.monotonic() + (when - self.clock()).total_seconds()

    def _schedule(self, key: str, pod: dict[str, Any]) -> None:
        t = trust(pod, self.keys)
        if t is Trust.SYSTEM:
            return
        if t is not Trust.ADMITTED:
            self.queue.add(key)  # reported (unverified) or reclaimed (retired) by process()
            return
        d = self._decide(key, pod)
        if d.reason is not None:
            self.queue.add(key)
        elif d.next_check is not None:
            self.queue.add_at(key, self._at(d.next_check))

    def _decide(self, key: str, pod: dict[str, Any]) -> Decision:
        ready_since = _ready_since(pod)
        return decide(
            pod, self.clock(), self.options.stuck, idle_since=self.idle.idle_since(key, ready_since)
        )

    def _on_event(self, kind: str, pod: dict[str, Any]) -> None:
        key = key_of(pod)
        if kind == "DELETED":
            self.queue.drop(key)
            self.idle.forget(key)
            self.reported.pop(key, None)
        else:
            self._schedule(key, pod)
        self.metrics.queue_depth.set(len(self.queue))

    def leadership_changed(self, leading: bool) -> None:
        self.metrics.is_leader.set(1 if leading else 0)
        if leading:
            # Whatever came due while we were standby is due now.
            self._reschedule_all()

    def keys_changed(self, keys: AdmissionKeys) -> None:
        """New admission keys (first read, a rotation, a retirement): decide again."""
        self.keys = keys
        self._reschedule_all()

    def _reschedule_all(self) -> None:
        for key, pod in list(self.informer.store.items()):
            self._schedule(key, pod)

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    # -- processing -----------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        self.http = aiohttp.ClientSession()
        tasks = [asyncio.ensure_future(self.informer.run(stop))]
        tasks += [asyncio.ensure_future(self._worker(stop)) for _ in range(self.options.workers)]
        try:
            await stop.wait()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.http.close()

    async def _worker(self, stop: asyncio.Event) -> None:
        await self.informer.synced.wait()
        while not stop.is_set():
            key = await self.queue.get()
            try:
                await self.process(key)
                self.queue.forget(key)
            except (ApiError, OSError, TimeoutError, aiohttp.ClientError) as e:
                delay = self.queue.retry(key)
                log.warning("reclaiming %s failed (%s); retry in %.2fs", key, e, delay)
            except Exception:
                delay = self.queue.retry(key)
                log.exception("reclaiming %s failed; retry in %.2fs", key, delay)
            finally:
                self.queue.done(key)
                self.metrics.queue_depth.set(len(self.queue))

    async def process(self, key: str) -> None:
        if not self.is_leader():
            return  # the leader does this; we reschedule everything on takeover
        namespace, name = key.split("/", 1)
        try:
            pod = await self.client.get(PODS, name, namespace)
        except ApiError as e:
            if e.not_found:
                return
            raise
        if not is_sandbox(pod):
            log.warning("%s lost its sandbox label; never touched", key)
            return
        t = trust(pod, self.keys)
        if t is Trust.SYSTEM:
            return
        if t is Trust.UNVERIFIED:
            if self.keys is not None and self.reported.get(key) != REASON_UNVERIFIED:
                self.reported[key] = REASON_UNVERIFIED
                self._event(pod, _UNVERIFIED, "Warning")
                self.metrics.reported.labels(REASON_UNVERIFIED).inc()
            return
        if t is Trust.RETIRED:
            d = Decision(
                REASON_KEY_RETIRED,
                "admitted under a cluster key generation that has been retired",
                delete=True,
                deadline=self.clock(),
            )
        else:
            d = self._decide(key, pod)
        if d.reason == REASON_IDLE:
            d = await self._confirm_idle(key, pod)
        if d.reason == REASON_LEASE_EXPIRED and self._held(key, pod, d):
            return
        if d.reason is None:
            if d.next_check is not None:
                self.queue.add_at(key, self._at(d.next_check))
            return
        if not d.delete:
            if self.reported.get(key) != d.reason:
                self.reported[key] = d.reason
                self._event(pod, d, "Warning")
                self.metrics.reported.labels(d.reason).inc()
            return
        if self.options.dry_run:
            if self.reported.get(key) != d.reason:
                self.reported[key] = d.reason
                self._event(pod, d, "Normal", prefix="dry run: would reclaim: ")
                self.metrics.reclaimed.labels(d.reason, "true").inc()
                log.info("dry run: would reclaim %s (%s: %s)", key, d.reason, d.message)
            return
        if not self.bucket.try_take():
            self.metrics.throttled.inc()
            self.queue.add_at(key, self.monotonic() + self.bucket.wait_time())
            return
        if not self.is_leader():  # leadership may have lapsed while we waited
            return
        await self._reclaim(key, pod, d)

    async def _reclaim(self, key: str, pod: dict[str, Any], d: Decision) -> None:
        md = pod["metadata"]
        self._event(pod, d, "Normal")  # the reason is on record before the pod goes
        try:
            await self.client.delete(
                PODS,
                md["name"],
                md["namespace"],
                uid=md["uid"],
                resource_version=md["resourceVersion"],
            )
        except ApiError as e:
            if e.not_found:
                log.info("%s already gone", key)
                return
            if e.conflict:
                # Changed since our read (e.g. the lease was extended): decide
                # again on the newer object rather than retrying the delete.
                self.metrics.conflicts.inc()
                self.queue.add(key)
                return
            raise
        lateness = (self.clock() - d.deadline).total_seconds() if d.deadline else 0.0
        self.metrics.reclaimed.labels(d.reason, "false").inc()
        self.metrics.latency.labels(d.reason).observe(max(0.0, lateness))
        log.info(
            "reclaimed %s: %s (%s), %.2fs after its deadline", key, d.reason, d.message, lateness
        )

    async def _confirm_idle(self, key: str, pod: dict[str, Any]) -> Decision:
        """Ask the daemon before calling a sandbox idle: fresh evidence only."""
        if self.http is None:
            return Decision()
        now = self.clock()
        idle_s = await poll_idle_seconds(self.http, pod)
        if idle_s is IDLE_UNSUPPORTED:
            self.metrics.idle_polls.labels("unsupported").inc()
            return Decision()  # a daemon without GET /v1/idle: idleness cannot be observed
        if idle_s is None:
            first = self.idle.failed(key, now)
            self.metrics.idle_polls.labels("unreachable").inc()
            if first:
                timeout = idle_timeout(pod) or UNREACHABLE_RETRY
                retry = min(UNREACHABLE_RETRY, timeout / 4)
                return Decision(next_check=now + retry)
        else:
            self.idle.observed(key, now, idle_s)
            self.metrics.idle_polls.labels("ok").inc()
        d = self._decide(key, pod)
        if d.reason is None and self.idle.state(key).unreachable_since is not None:
            timeout = idle_timeout(pod) or UNREACHABLE_RETRY
            retry = now + min(UNREACHABLE_RETRY, timeout / 4)
            return Decision(next_check=min(retry, d.next_check or retry))
        if d.reason == REASON_IDLE and idle_s is None:
            return Decision(
                d.reason,
                "daemon unreachable for over its idle timeout",
                delete=True,
                deadline=d.deadline,
            )
        return d

    def _held(self, key: str, pod: dict[str, Any], d: Decision) -> bool:
        """Hold a lease that ended while extensions could not be admitted (outage.py)."""
        if self.health is None or d.deadline is None:
            return False
        now = self.clock()
        if not self.health.known:
            # Started a moment ago: the first probe answers within its period.
            self.queue.add_at(key, self._at(now + HELD_RETRY))
            return True
        hold = self.health.hold_until(d.deadline, now, self.options.extension_grace)
        if hold is None:
            return False
        self.queue.add_at(key, self._at(max(hold.until, now + HELD_RETRY)))
        if hold.outage is not None and self.reported.get(key) != REASON_LEASE_HELD:
            self.reported[key] = REASON_LEASE_HELD
            held = Decision(
                REASON_LEASE_HELD,
                f"{d.message}, while {hold.outage.describe()}, so lease extensions could not "
                f"be admitted; held until it has been back for {self.options.extension_grace}",
            )
            self._event(pod, held, "Warning")
            self.metrics.reported.labels(REASON_LEASE_HELD).inc()
        return True

    def _event(self, pod: dict[str, Any], d: Decision, type_: str, prefix: str = "") -> None:
        if self.recorder is not None and d.reason is not None:
            self.recorder.emit(ObjectRef.of(pod), d.reason, prefix + d.message, type_)


_UNVERIFIED = Decision(
    REASON_UNVERIFIED,
    "no valid admission marker (sandman.dev/admitted): not admitted by Sandman's webhook, "
    "so the reaper leaves it alone (the kubelet's activeDeadlineSeconds still applies)",
)


def _ready_since(pod: dict[str, Any]) -> dt.datetime | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            try:
                return parse_time(c.get("lastTransitionTime", ""))
            except ContractError:
                return None
    return None
