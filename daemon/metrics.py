"""The daemon's Prometheus metrics, on a registry of its own (no globals)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Exec latencies on loopback are ~1 ms; user commands run for minutes. The
# buckets span both so the histogram answers "is the daemon fast" and "what
# are the agents doing".
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    1800,
)


@dataclass(frozen=True)
class DaemonMetrics:
    registry: CollectorRegistry
    requests: Counter
    request_seconds: Histogram
    commands: Counter
    orphans_reaped: Gauge
    background: Gauge
    sessions: Gauge

    @classmethod
    def create(cls) -> DaemonMetrics:
        r = CollectorRegistry()
        return cls(
            registry=r,
            requests=Counter(
                "sandman_daemon_requests_total", "API requests", ["route", "code"], registry=r
            ),
            request_seconds=Histogram(
                "sandman_daemon_request_duration_seconds",
                "API request latency",
                ["route"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            ),
            commands=Counter(
                "sandman_daemon_commands_total",
                "commands run to completion",
                ["result"],
                registry=r,
            ),
            orphans_reaped=Gauge(
                "sandman_daemon_orphans_reaped", "adopted orphans reaped", registry=r
            ),
            background=Gauge(
                "sandman_daemon_background_processes",
                "background processes tracked",
                registry=r,
            ),
            sessions=Gauge("sandman_daemon_sessions", "open shell sessions", registry=r),
        )
