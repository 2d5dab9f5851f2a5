"""Metrics of an SDK process: warm-pool claims and the create budget.

The pool manager is a library inside the trainer's process, so what only it
knows (how long a claim took, how much of the one create budget is used)
reaches Prometheus through an endpoint of that process, served on the
client's event loop when ``SANDMAN_METRICS_LISTEN=HOST:PORT`` is set (or
``Telemetry(metrics=SdkMetrics(), listen=...)`` is given). Pool depth and
failing pools do not need it: the reaper exports them from the pods' labels.

Series (``sandman_pool_*``; build info as component ``sdk``):
    sandman_pool_claim_duration_seconds{result}   histogram; ok | no_idle | error
    sandman_pool_creates_total{kind}              on_demand | refill, one per token granted
    sandman_pool_create_budget_per_second         the budget's rate (sum of live managers)
    sandman_pool_create_waiting                   on-demand creates waiting for a token

Needs prometheus-client (``[server]`` or ``[otel]``).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sandman import __version__
from sandman.serving import metrics_response
from sandman.telemetry.prom import build_info

# Claims: one JSON patch when a pod is idle (~5-20 ms), up to the fleet's
# claim_wait_s (2 s) when the pool is still growing; coarse buckets above.
CLAIM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10)
KINDS = ("on_demand", "refill")


class _Budget(Collector):
    """Creates granted and the budget, summed over the process's live pool
    managers; a closed manager's grants are kept (counters never go back).
    Event-loop only."""

    def __init__(self) -> None:
        self.live: weakref.WeakSet[Any] = weakref.WeakSet()
        self.retired = dict.fromkeys(KINDS, 0)

    def collect(self) -> Iterator[Metric]:
        granted = dict(self.retired)
        rate = waiting = 0.0
        for m in list(self.live):
            for k in KINDS:
                granted[k] += m.limiter.granted.get(k, 0)
            rate += m.config.create_rate
            waiting += m.limiter.waiting
        c = CounterMetricFamily(
            "sandman_pool_creates",
            "pod creates granted by the create budget, by kind (on_demand first, refill)",
            labels=["kind"],
        )
        for k in KINDS:
            c.add_metric([k], granted[k])
        yield c
        yield GaugeMetricFamily(
            "sandman_pool_create_budget_per_second",
            "creates/s the pool managers of this process may make together",
            value=rate,
        )
        yield GaugeMetricFamily(
            "sandman_pool_create_waiting",
            "on-demand creates waiting for a token",
            value=waiting,
        )


class SdkMetrics:
    """One per SDK process (held by its SandmanClient's Telemetry). Event-loop only."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        build_info(self.registry, "sdk", __version__)
        self.claims = Histogram(
            "sandman_pool_claim_duration_seconds",
            "time for a pool claim to return a pod (or give up), by result",
            ["result"],
            buckets=CLAIM_BUCKETS,
            registry=self.registry,
        )
        for result in ("ok", "no_idle", "error"):  # exported from the start (at 0)
            self.claims.labels(result)
        self._budget = _Budget()
        self.registry.register(self._budget)
        self._runner: web.AppRunner | None = None

    def watch(self, manager: Any) -> None:
        """Count ``manager``'s creates and budget (a PoolManager) while it lives."""
        self._budget.live.add(manager)

    def forget(self, manager: Any) -> None:
        if manager in self._budget.live:
            for k in KINDS:
                self._budget.retired[k] += manager.limiter.granted.get(k, 0)
            self._budget.live.discard(manager)

    def claim_done(self, result: str, seconds: float) -> None:
        self.claims.labels(result).observe(seconds)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    # -- the endpoint ---------------------------------------------------------------
    async def serve(self, host: str, port: int) -> int:
        """Serve GET /metrics on ``host:port`` (port 0: any); returns the port."""
        app = web.Application()

        async def metrics(_request: web.Request) -> web.Response:
            return metrics_response(self.registry)

        app.router.add_get("/metrics", metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port, reuse_address=True).start()
        return int(self._runner.addresses[0][1])

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
