"""The extender's Prometheus metrics, on a registry of its own.

Besides latency and request counts, every answered /prioritize counts what
the node it ranked first had of the pod's images
(``sandman_extender_placements_total{cache}``): the cache-hit ratio is
``hit`` over all placements that had anything to hit (``cold``: no
candidate held or pulled any of it, so no placement could have hit).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sandman.extender import __version__
from sandman.extender.index import IndexStats, PodFacts
from sandman.telemetry.prom import build_info

# /prioritize must stay under 10 ms p99 at 1,000 nodes (design section 11) and
# the scheduler gives up at its httpTimeout (100 ms): fine buckets below 10 ms,
# coarse ones up to the timeout and past it.
BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 1)
CACHE_OUTCOMES = ("hit", "partial", "pulling", "miss", "cold")


@dataclass(frozen=True)
class ExtenderMetrics:
    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    nodes: Gauge
    images: Gauge
    entries: Gauge
    pods: Gauge
    assumed: Gauge
    placements: Counter

    @classmethod
    def create(cls) -> ExtenderMetrics:
        r = CollectorRegistry()
        build_info(r, "extender", __version__)
        return cls(
            registry=r,
            requests=Counter(
                "sandman_extender_requests_total",
                "extender calls by verb and HTTP status",
                ["verb", "code"],
                registry=r,
            ),
            latency=Histogram(
                "sandman_extender_request_duration_seconds",
                "time to answer one extender call (body read to response built)",
                ["verb"],
                buckets=BUCKETS,
                registry=r,
            ),
            nodes=Gauge("sandman_extender_nodes_tracked", "nodes in the image index", registry=r),
            images=Gauge(
                "sandman_extender_images_tracked",
                "image names the index knows (size or digest)",
                registry=r,
            ),
            entries=Gauge(
                "sandman_extender_index_entries",
                "(node, image) pairs the index holds: its size",
                registry=r,
            ),
            pods=Gauge("sandman_extender_pods_tracked", "bound pods in the index", registry=r),
            assumed=Gauge(
                "sandman_extender_assumed_pods",
                "placements predicted but not yet seen bound",
                registry=r,
            ),
            placements=Counter(
                "sandman_extender_placements_total",
                "prioritize answers by what the top-ranked node holds of the pod's images: "
                "hit (all), partial, pulling (on its way there), miss (none, though "
                "another candidate had some), cold (no candidate had any)",
                ["cache"],
                registry=r,
            ),
        )

    def __post_init__(self) -> None:
        for outcome in CACHE_OUTCOMES:  # every outcome exported from the start (at 0)
            self.placements.labels(outcome)

    def observe_placement(self, facts: PodFacts, winner: str | None) -> None:
        if winner is not None:
            self.placements.labels(cache_outcome(facts, winner)).inc()

    def observe(self, verb: str, code: int, seconds: float) -> None:
        self.latency.labels(verb).observe(seconds)
        self.requests.labels(verb, str(code)).inc()

    def refresh(self, stats: IndexStats) -> None:
        self.nodes.set(stats.nodes)
        self.images.set(stats.image_names)
        self.entries.set(stats.entries)
        self.pods.set(stats.pods)
        self.assumed.set(stats.assumed)


def cache_outcome(facts: PodFacts, winner: str) -> str:
    """What ``winner`` has of the pod's images (pure; see the module docstring)."""
    if facts.total <= 0:
        return "cold"  # no image to hold
    f = facts.facts.get(winner, facts.default)
    if f.held_bytes >= facts.total:
        return "hit"
    if f.held_bytes > 0:
        return "partial"
    if f.pulling_bytes > 0:
        return "pulling"
    d = facts.default
    if (
        d.held_bytes
        or d.pulling_bytes
        or any(x.held_bytes or x.pulling_bytes for x in facts.facts.values())
    ):
        return "miss"
    return "cold"
