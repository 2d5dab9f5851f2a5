"""A pool's health from its pods (pure): what `sandman pool ls` and Events show.

A pool whose pods cannot start (a missing image, a crash at start) must be
visible, and must not churn: the manager stops adding pods to it while it is
``Failing`` and says why, instead of creating pod after pod that will never
become Ready.
"""

from __future__ import annotations

import collections
import datetime as dt
from dataclasses import asdict, dataclass, field
from typing import Any

from sandman.client import reuse, startup
from sandman.contract import LABEL_STATE
from sandman.pools.spec import STATE_CLAIMED, STATE_IDLE

HEALTHY, WARMING, FAILING = "Healthy", "Warming", "Failing"


@dataclass
class PoolHealth:
    ready: int = 0  # idle and Ready: claimable now
    starting: int = 0  # idle, on their way to Ready
    failing: int = 0  # idle pods that cannot start (reasons below)
    claimed: int = 0  # claimed pods still alive (they keep the pool label)
    expired: int = 0  # idle pods that reached the policy's max lifetime (to recycle)
    restarted: int = 0  # idle pods whose container restarted: never claimed (to recycle)
    condition: str = HEALTHY
    reasons: dict[str, int] = field(default_factory=dict)  # e.g. {"ImageNotFound": 3}
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def is_expired(pod: dict[str, Any]) -> bool:
    """An idle pod the kubelet ended at its activeDeadlineSeconds (the webhook
    sets the policy's max lifetime): old age, not a pool that cannot start."""
    st = pod.get("status") or {}
    return st.get("phase") == "Failed" and st.get("reason") == "DeadlineExceeded"


def is_restarted(pod: dict[str, Any]) -> bool:
    """A pod whose container restarted: its daemon's pristine record proves
    nothing (``sandman.client.reuse``), so no claim takes it; it is replaced."""
    return bool(reuse.restarts(pod))


def pool_health(pods: list[dict[str, Any]]) -> PoolHealth:
    h = PoolHealth()
    reasons: collections.Counter[str] = collections.Counter()
    message = ""
    for pod in pods:
        md = pod.get("metadata") or {}
        if md.get("deletionTimestamp"):
            continue
        state = (md.get("labels") or {}).get(LABEL_STATE)
        if state == STATE_CLAIMED:
            h.claimed += 1
            continue
        if state != STATE_IDLE:
            continue
        if is_expired(pod):
            h.expired += 1
            continue
        if is_restarted(pod):
            h.restarted += 1
            continue
        if startup.ready(pod):
            h.ready += 1
            continue
        # A pool pod has no deadline to blame an unschedulable wait on: only
        # causes that will not fix themselves count as failing.
        err = startup.verdict(pod, waited=dt.timedelta(0), unschedulable_grace=dt.timedelta.max)
        if err is not None and not err.retryable:
            h.failing += 1
            reasons[err.reason] += 1
            message = message or err.message
        else:
            h.starting += 1
    h.reasons = dict(reasons)
    h.message = message
    if h.failing and not h.ready:
        h.condition = FAILING
    elif h.starting and not h.ready:
        h.condition = WARMING
    return h
