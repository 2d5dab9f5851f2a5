"""Leader election on a coordination.k8s.io/v1 Lease (client-go's algorithm).

Prevents two replicas acting at once (two reapers deleting the same sandbox
twice is harmless thanks to preconditions, but double Events and double rate
budgets are not) and none acting after a crash (a standby takes over once the
lease goes unrenewed for ``lease_duration``).

Like client-go, expiry is judged by *our* clock from when we last saw the
lease record change, never by comparing the holder's timestamps to our clock
(clock skew between nodes must not hand out two leaderships). Updates carry
the lease's resourceVersion, so two candidates cannot both win a takeover.
A leader that cannot renew within ``renew_deadline`` stops calling itself
leader before its lease could have expired for others (renew_deadline <
lease_duration). Event-loop only (not thread-safe).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from sandman.kube_async import LEASES, ApiError, KubeClient

log = logging.getLogger(__name__)

# client-go's defaults for controllers (kube-controller-manager uses the same).
LEASE_DURATION = dt.timedelta(seconds=15)
RENEW_DEADLINE = dt.timedelta(seconds=10)
RETRY_PERIOD = dt.timedelta(seconds=2)


def _micro(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: dt.timedelta = LEASE_DURATION,
        renew_deadline: dt.timedelta = RENEW_DEADLINE,
        retry_period: dt.timedelta = RETRY_PERIOD,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self.client = client
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration, self.renew_deadline = lease_duration, renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self.on_change = on_change or (lambda _leading: None)
        self._renewed_at: dt.datetime | None = None  # our clock, at our last successful renew
        self._observed: tuple[Any, ...] | None = None
        self._observed_at: dt.datetime | None = None
        self._lapsed = False  # is_leader() said no since run() last looked
        self.transitions = 0

    def is_leader(self) -> bool:
        """True only while our last renewal is younger than the renew deadline.

        A False answer while we hold a renewal is a lapse, noted for ``run``:
        a renewal that took most of the renew deadline (a loaded apiserver)
        makes us no leader for a moment that ``run``'s loop, waiting on that
        renewal, never sees; whoever asked meanwhile acted as a standby."""
        leading = (
            self._renewed_at is not None and self.clock() - self._renewed_at < self.renew_deadline
        )
        if not leading and self._renewed_at is not None:
            self._lapsed = True
        return leading

    def _lease_body(
        self, now: dt.datetime, transitions: int, acquired: str | None
    ) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration.total_seconds()),
            "acquireTime": acquired or _micro(now),
            "renewTime": _micro(now),
            "leaseTransitions": transitions,
        }

    async def try_acquire_or_renew(self) -> bool:
        now = self.clock()
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace)
        except ApiError as e:
            if not e.not_found:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._lease_body(now, 0, None),
            }
            try:
                await self.client.create(LEASES, body, self.namespace)
            except ApiError as e2:
                if e2.conflict:
                    return False  # someone else created it first
                raise
            self._renewed_at = now
            return True
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("acquireTime"))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        holder = spec.get("holderIdentity")
        duration = dt.timedelta(seconds=spec.get("leaseDurationSeconds") or 15)
        mine = holder == self.identity
        expired = self._observed_at is not None and self._observed_at + duration <= now
        if holder and not mine and not expired:
            self._renewed_at = None
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        lease["spec"] = self._lease_body(
            now, transitions, spec.get("acquireTime") if mine else None
        )
        try:
            await self.client.replace(LEASES, self.name, lease, self.namespace)
        except ApiError as e:
            if e.conflict:
                return False  # the record moved under us: re-read next round
            raise
        self._renewed_at = now
        self._observed = (self.identity, lease["spec"]["renewTime"], lease["spec"]["acquireTime"])
        self._observed_at = now
        return True

    async def run(self, stop: asyncio.Event) -> None:
        leading = False
        while not stop.is_set():
            try:
                await self.try_acquire_or_renew()
            except (ApiError, OSError, TimeoutError) as e:
                log.warning("leader election %s/%s: %s", self.namespace, self.name, e)
            now_leading = self.is_leader()
            lapsed, self._lapsed = self._lapsed, False
            if leading and now_leading and lapsed:
                # Lost and won again within one renewal: report both, so that
                # what was skipped as a standby meanwhile is taken up again
                # (seen in a scale run: a reaper dropped 327 due sandboxes
                # while a slow renewal lapsed, then led on and never
                # reclaimed them).
                log.warning(
                    "%s: leadership of %s/%s lapsed during a slow renewal; leading again",
                    self.identity,
                    self.namespace,
                    self.name,
                )
                self.transitions += 2
                self.on_change(False)
                self.on_change(True)
            elif now_leading != leading:
                leading = now_leading
                self.transitions += 1
                log.info(
                    "%s %s leadership of %s/%s",
                    self.identity,
                    "acquired" if leading else "lost",
                    self.namespace,
                    self.name,
                )
                self.on_change(leading)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.retry_period.total_seconds())
        if leading:
            await self.release()

    async def release(self) -> None:
        """Give the lease up on a clean shutdown, so a standby needn't wait it out."""
        self._renewed_at = None
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = ""
            lease["spec"]["leaseDurationSeconds"] = 1
            await self.client.replace(LEASES, self.name, lease, self.namespace)
        except (ApiError, OSError, TimeoutError) as e:
            log.warning("releasing lease %s/%s: %s", self.namespace, self.name, e)
