"""Prometheus helpers every component shares: build info and mirrored counters.

Imported only where metrics are built (components, or an SDK process that
asked for a metrics endpoint): prometheus-client comes with ``[server]``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

BUILD_INFO = "sandman_build_info"


def build_info(registry: CollectorRegistry, component: str, version: str) -> Gauge:
    """``sandman_build_info{component, version} 1``: which build answers (the
    dashboard's version table and ``count by (version)`` during a rollout)."""
    g = Gauge(
        BUILD_INFO,
        "1 per running component, labelled with its build",
        ["component", "version"],
        registry=registry,
    )
    g.labels(component, version).set(1)
    return g


class CounterMirror:
    """A counter whose running total is kept elsewhere (a policy source's
    reload count, a client's request count), exported as a real counter.

    The bug it prevents: exporting such totals as gauges (``set(n)``), which
    makes ``rate()`` impossible and hides restarts. ``update`` adds what the
    source counted since the last scrape; a source that went backwards (it was
    replaced) restarts the mirror's baseline instead of decreasing it.
    Not thread-safe: call it from the scrape handler's event loop.
    """

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self._seen: dict[tuple[str, ...], float] = {}

    def update(self, total: float, *labels: str) -> None:
        last = self._seen.get(labels, 0.0)
        self._seen[labels] = total
        delta = total - last if total >= last else total
        if delta > 0:
            (self.counter.labels(*labels) if labels else self.counter).inc(delta)
        elif labels:
            self.counter.labels(*labels)  # the series exists from the first scrape
