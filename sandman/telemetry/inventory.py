"""What the cluster's sandboxes look like right now (pure: pods and ``now`` in, counts out).

The reaper watches every sandbox pod already; at each scrape it hands its
cache here and exports the counts, so that "sandboxes by phase", "pool
depth" and "stuck Pending" need neither kube-state-metrics (which would need
a label allow-list to see ``sandman.dev/*`` labels) nor a second watch.

Pools are counted from their pods' labels (``sandman.dev/pool``,
``sandman.dev/state``) with the pool manager's own health rules
(``sandman.pools.health``), so the dashboard and ``sandman pool ls`` agree.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sandman.contract import LABEL_POOL, ContractError, parse_time
from sandman.pools.health import FAILING, pool_health

TERMINATING = "Terminating"  # a phase of our own: deletionTimestamp set
POOL_STATES = ("ready", "starting", "failing", "claimed", "expired", "restarted")


@dataclass
class Inventory:
    sandboxes: dict[tuple[str, str], int] = field(default_factory=dict)  # (ns, phase) -> n
    pending_oldest_s: dict[str, float] = field(default_factory=dict)  # ns -> age of oldest
    pools: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (ns, pool, state)
    pool_failing: dict[tuple[str, str], int] = field(default_factory=dict)  # (ns, pool) -> 0|1


def _created(pod: dict[str, Any]) -> dt.datetime | None:
    value = (pod.get("metadata") or {}).get("creationTimestamp")
    if not value:
        return None
    try:
        return parse_time(value)
    except ContractError:
        return None


def phase_of(pod: dict[str, Any]) -> str:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return TERMINATING
    return str((pod.get("status") or {}).get("phase") or "Pending")


def take(pods: Iterable[dict[str, Any]], now: dt.datetime) -> Inventory:
    inv = Inventory()
    counts: dict[tuple[str, str], int] = defaultdict(int)
    by_pool: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for pod in pods:
        md = pod.get("metadata") or {}
        ns = str(md.get("namespace") or "")
        phase = phase_of(pod)
        counts[(ns, phase)] += 1
        if phase == "Pending":
            created = _created(pod)
            if created is not None:
                age = max(0.0, (now - created).total_seconds())
                inv.pending_oldest_s[ns] = max(age, inv.pending_oldest_s.get(ns, 0.0))
        pool = (md.get("labels") or {}).get(LABEL_POOL)
        if pool:
            by_pool[(ns, pool)].append(pod)
    inv.sandboxes = dict(counts)
    for (ns, pool), members in by_pool.items():
        h = pool_health(members)
        for state in POOL_STATES:
            inv.pools[(ns, pool, state)] = getattr(h, state)
        inv.pool_failing[(ns, pool)] = 1 if h.condition == FAILING else 0
    return inv
