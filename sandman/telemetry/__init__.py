"""Observability: metrics helpers, the sandbox inventory, and (optional) traces.

- ``prom``: build info and mirrored counters for the components (needs
  prometheus-client, ``[server]``).
- ``inventory``: counts of sandbox pods by phase and pool state (pure).
- ``phases``: a sandbox's start as phases from what the SDK records (pure).
- ``tracing``: OpenTelemetry traces of sandbox starts and fleet rollouts,
  exported over OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set
  (``[otel]``); nothing is imported and nothing costs when it is not.
- ``sdkmetrics``: the pool manager's claim latency and create budget on an
  optional metrics endpoint of the SDK process (``SANDMAN_METRICS_LISTEN``).
- ``promql``: the metric names a PromQL expression reads (checks the
  dashboard and alerts in manifests/monitoring/ against live scrapes).
- ``render``: the dashboard drawn from query results with matplotlib
  (``[plot]``), for docs/observability.md.

This package itself imports only the standard library: the SDK imports it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sandman.contract import ENV_METRICS_LISTEN
from sandman.telemetry.tracing import NO_TRACING, NoTracing, OtlpTracing
from sandman.telemetry.tracing import from_env as tracing_from_env

if TYPE_CHECKING:
    from sandman.telemetry.sdkmetrics import SdkMetrics

__all__ = ["ENV_METRICS_LISTEN", "Telemetry"]

log = logging.getLogger(__name__)


@dataclass
class Telemetry:
    """What one SandmanClient reports, and where (off unless configured).

    ``listen`` serves ``metrics`` on that address from ``start()`` (the
    client's open) to ``aclose()``. One client per process is the SDK's rule;
    a second client asking for the same address logs a warning and serves
    nothing. Event-loop only.
    """

    tracing: NoTracing | OtlpTracing = NO_TRACING
    metrics: SdkMetrics | None = None
    listen: tuple[str, int] | None = None
    port: int | None = field(default=None, init=False)  # bound, once started

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Telemetry:
        env = os.environ if environ is None else environ
        t = cls(tracing=tracing_from_env(env))
        value = env.get(ENV_METRICS_LISTEN, "").strip()
        if value:
            from sandman.serving import parse_listen

            try:
                t.listen = parse_listen(value, "127.0.0.1")
            except Exception as e:
                raise ValueError(f"{ENV_METRICS_LISTEN}: {e}") from None
            try:
                from sandman.telemetry.sdkmetrics import SdkMetrics
            except ImportError:
                log.warning(
                    "%s is set but prometheus-client is not installed; no metrics endpoint "
                    "(pip install 'sandman-k8s[otel]')",
                    ENV_METRICS_LISTEN,
                )
                t.listen = None
            else:
                t.metrics = SdkMetrics()
        return t

    async def start(self) -> None:
        if self.metrics is None or self.listen is None or self.port is not None:
            return
        try:
            self.port = await self.metrics.serve(*self.listen)
        except OSError as e:
            log.warning("metrics endpoint %s:%d not served: %s", *self.listen, e)

    async def aclose(self) -> None:
        if self.metrics is not None:
            await self.metrics.aclose()
        await self.tracing.aclose()
