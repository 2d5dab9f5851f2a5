"""The reaper's Prometheus metrics, on a registry of its own."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Reclaim latency after a deadline: the target is under 2 s (design section
# 11); buckets resolve that range and still show a backlog of minutes.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)


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
    api_requests: Gauge

    @classmethod
    def create(cls) -> ReaperMetrics:
        r = CollectorRegistry()
        return cls(
            registry=r,
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
            api_requests=Gauge(
                "sandman_reaper_api_requests",
                "apiserver requests made, by verb",
                ["verb"],
                registry=r,
            ),
        )
