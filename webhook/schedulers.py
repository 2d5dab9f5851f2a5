"""Is the scheduler a sandbox names running? Judged from its leader-election Lease.

A pod that names a scheduler nobody runs stays Pending forever, without an
Event saying why: the failure this module exists to surface. kube-scheduler
(and sandman-scheduler, the same binary) holds a Lease while it runs with
leader election, renewing it every couple of seconds; a Lease that is
missing, has no holder or has not been renewed within its duration means no
instance is scheduling. The webhook warns (admission warning and an Event
on the pod); it never denies, since a scheduler may be on its way.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from sandman.contract import NAMESPACE, SCHEDULER_NAME, ContractError, parse_time
from sandman.kube_async import LEASES, ApiError, KubeClient

# Where each scheduler's leader-election Lease lives (kube-scheduler's
# defaults; sandman-scheduler's as manifests/extender/config.yaml sets it).
DEFAULT_LEASES: Mapping[str, tuple[str, str]] = {
    "default-scheduler": ("kube-system", "kube-scheduler"),
    SCHEDULER_NAME: (NAMESPACE, SCHEDULER_NAME),
}
# Clocks of the scheduler's node and ours may differ; a few seconds is what
# NTP-synchronised nodes keep, 10 s keeps a healthy Lease from looking stale.
CLOCK_SKEW_S = 10.0
# How long a Lease read answers for: a burst of a thousand sandboxes costs
# one GET per scheduler per 5 s, and a stopped scheduler is noticed 5 s late.
LEASE_CACHE_S = 5.0
# The read happens inside a validating admission (5 s timeoutSeconds, and
# failurePolicy Fail): a slow apiserver costs the warning, never the pod.
LEASE_READ_TIMEOUT_S = 1.0


def lease_problem(lease: dict[str, Any] | None, where: str, now: dt.datetime) -> str | None:
    """Why ``lease`` shows no running instance, or None when one holds it (pure)."""
    if lease is None:
        return f"no Lease {where} (the scheduler is not running, or runs without leader election)"
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if not holder:
        return f"Lease {where} has no holder"
    try:
        renewed = parse_time(str(spec.get("renewTime") or ""), field="renewTime")
    except ContractError:
        return f"Lease {where} has never been renewed"
    duration = float(spec.get("leaseDurationSeconds") or 15)
    age = (now - renewed).total_seconds()
    if age > duration + CLOCK_SKEW_S:
        return f"Lease {where} was last renewed {age:.0f}s ago by {holder} (lease {duration:g}s)"
    return None


def warning_text(scheduler: str, problem: str) -> str:
    return (
        f"sandbox names schedulerName {scheduler!r}, which shows no running instance ({problem}); "
        "the pod stays Pending until one runs: start it, or set the policy's `scheduler: default`"
    )


class SchedulerLeases:
    """Cached reads of scheduler Leases. Event-loop only; safe for concurrent admissions."""

    def __init__(
        self,
        client: KubeClient,
        leases: Mapping[str, tuple[str, str]],
        clock: Callable[[], dt.datetime],
        monotonic: Callable[[], float],
    ) -> None:
        self.client = client
        self.leases = dict(leases)
        self.clock = clock
        self.monotonic = monotonic
        self._cache: dict[str, tuple[dict[str, Any] | None, float]] = {}

    async def problem(self, scheduler: str) -> str | None:
        """Why ``scheduler`` looks stopped; None when it runs or we cannot tell."""
        where = self.leases.get(scheduler)
        if where is None:
            return None  # a scheduler we know no Lease for: nothing to judge by
        ns, name = where
        hit = self._cache.get(scheduler)
        if hit is None or self.monotonic() >= hit[1]:
            try:
                lease: dict[str, Any] | None = await self.client.request(
                    "GET", LEASES.path(ns, name), timeout=LEASE_READ_TIMEOUT_S
                )
            except ApiError as e:
                if e.status != 404:
                    return None  # forbidden or failing: no basis for a warning
                lease = None
            except (aiohttp.ClientError, TimeoutError):
                return None
            hit = (lease, self.monotonic() + LEASE_CACHE_S)
            self._cache[scheduler] = hit
        return lease_problem(hit[0], f"{ns}/{name}", self.clock())


def parse_lease_flag(value: str) -> tuple[str, tuple[str, str] | None]:
    """``SCHEDULER=NAMESPACE/LEASE`` (the webhook's ``--scheduler-lease``); an empty
    ``SCHEDULER=`` means "no Lease to judge by" (a scheduler without leader election)."""
    scheduler, eq, where = value.partition("=")
    if eq and scheduler and not where:
        return scheduler, None
    ns, slash, name = where.partition("/")
    if not (eq and slash and scheduler and ns and name):
        raise ValueError(f"--scheduler-lease {value!r}: expected SCHEDULER=NAMESPACE/LEASE")
    return scheduler, (ns, name)


def lease_map(
    flags: list[tuple[str, tuple[str, str] | None]],
) -> tuple[tuple[str, tuple[str, str]], ...]:
    """The defaults overridden by ``--scheduler-lease`` flags (None drops one)."""
    merged: dict[str, tuple[str, str] | None] = {**DEFAULT_LEASES, **dict(flags)}
    return tuple((k, v) for k, v in merged.items() if v is not None)
