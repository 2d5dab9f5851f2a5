"""The reaper's Prometheus metrics, on a registry of its own.

Besides its own work (reclaims, latency, queue, leadership), the leader
exports an inventory of every sandbox its watch holds (``sandman_sandboxes``,
``sandman_sandboxes_pending_oldest_seconds``, ``sandman_pool_sandboxes``,
``sandman_pool_failing``), computed at scrape time from its cache by
``sandman.telemetry.inventory``: one pass over the cached pods per scrape
(a few tens of ms at 10,000 sandboxes, once per scrape interval). Only the
leader exports it, so ``sum`` over replicas never counts a pod twice.
"""

from __future__ import annotations

import collections
import datetime as dt
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sandman import __version__
from sandman.contract import (
    REASON_EXITED,
    REASON_IDLE,
    REASON_KEY_RETIRED,
    REASON_LEASE_EXPIRED,
    REASON_STUCK,
)
from sandman.telemetry.inventory import Inventory, take
from sandman.telemetry.prom import CounterMirror, build_info

# Reclaim latency after a deadline: the target is under 2 s (design section
# 11); buckets resolve that range and still show a backlog of minutes.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)
# Every reclaim reason is exported from the start (at 0), so rate() sees the
# first reclaim of each and the dashboard's queries always find the series.
RECLAIM_REASONS = (
    REASON_LEASE_EXPIRED,
    REASON_IDLE,
    REASON_STUCK,
    REASON_EXITED,
    REASON_KEY_RETIRED,
)


class InventoryCollector(Collector):
    """Yields the last inventory handed to ``set`` (None: nothing, e.g. on a standby)."""

    def __init__(self) -> None:
        self.inventory: Inventory | None = None

    def collect(self) -> Iterator[Metric]:
        inv = self.inventory or Inventory()
        g = GaugeMetricFamily(
            "sandman_sandboxes",
            "sandbox pods by namespace and phase (Terminating: being deleted)",
            labels=["namespace", "phase"],
        )
        for (ns, phase), n in sorted(inv.sandboxes.items()):
            g.add_metric([ns, phase], n)
        yield g
        g = GaugeMetricFamily(
            "sandman_sandboxes_pending_oldest_seconds",
            "age of the oldest Pending sandbox, by namespace (absent: none Pending)",
            labels=["namespace"],
        )
        for ns, age in sorted(inv.pending_oldest_s.items()):
            g.add_metric([ns], age)
        yield g
        g = GaugeMetricFamily(
            "sandman_pool_sandboxes",
            "warm-pool pods by pool and state (ready = pool depth: claimable now)",
            labels=["namespace", "pool", "state"],
        )
        for (ns, pool, state), n in sorted(inv.pools.items()):
            g.add_metric([ns, pool, state], n)
        yield g
        g = GaugeMetricFamily(
            "sandman_pool_failing",
            "1 while a pool's pods cannot start and none is Ready (it stops growing)",
            labels=["namespace", "pool"],
        )
        for (ns, pool), v in sorted(inv.pool_failing.items()):
            g.add_metric([ns, pool], v)
        yield g


@dataclass(frozen=True)
class ReaperMetrics:
    registry: CollectorRegistry
    reclaimed: Counter
    reported: Counter
    latency: Histogram
    queue_depth: Gauge
    throttled: Counter
    conflicts: Counter
    idle_polls: Counter
    is_leader: Gauge
    api_requests: CounterMirror
    inventory: InventoryCollector = field(default_factory=InventoryCollector)

    @classmethod
    def create(cls) -> ReaperMetrics:
        r = CollectorRegistry()
        build_info(r, "reaper", __version__)
        inventory = InventoryCollector()
        r.register(inventory)
        m = cls(
            registry=r,
            inventory=inventory,
            reclaimed=Counter(
                "sandman_reaper_reclaimed_total",
                "sandboxes reclaimed",
                ["reason", "dry_run"],
                registry=r,
            ),
            reported=Counter(
                "sandman_reaper_reported_total",
                "sandboxes reported but left to their owner",
                ["reason"],
                registry=r,
            ),
            latency=Histogram(
                "sandman_reaper_reclaim_latency_seconds",
                "delete time minus the sandbox's deadline",
                ["reason"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            ),
            queue_depth=Gauge(
                "sandman_reaper_queue_depth", "sandboxes waiting for a deadline", registry=r
            ),
            throttled=Counter(
                "sandman_reaper_deletes_throttled_total",
                "deletes postponed by the rate limit",
                registry=r,
            ),
            conflicts=Counter(
                "sandman_reaper_conflicts_total",
                "deletes refused by preconditions (pod changed)",
                registry=r,
            ),
            idle_polls=Counter(
                "sandman_reaper_idle_polls_total", "daemon status polls", ["result"], registry=r
            ),
            is_leader=Gauge("sandman_reaper_is_leader", "1 while this replica leads", registry=r),
            api_requests=CounterMirror(
                Counter(
                    "sandman_reaper_api_requests_total",
                    "apiserver requests made, by verb",
                    ["verb"],
                    registry=r,
                )
            ),
        )
        for reason in RECLAIM_REASONS:
            m.latency.labels(reason)
            for dry in ("false", "true"):
                m.reclaimed.labels(reason, dry)
        return m

    def refresh(
        self,
        requests: Mapping[str, int],
        cache: tuple[Iterable[dict[str, Any]], dt.datetime] | None,
    ) -> None:
        """At scrape time: mirror the client's request counts; take the inventory
        of the cached pods at ``now`` (the leader's synced cache; None on a standby)."""
        for verb, n in collections.Counter(requests).items():
            self.api_requests.update(n, verb)
        self.inventory.inventory = None if cache is None else take(*cache)
