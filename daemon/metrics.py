"""The daemon's Prometheus metrics, written in the text exposition format by hand.

prometheus_client cost the daemon ~2 MiB and ~20 ms of start-up for six
series; the format (version 0.0.4) is a few lines of text. One instance per
app (no globals); event-loop only, not thread-safe.

Served without a token (a PodMonitor cannot hold one per sandbox), so what is
here MUST stay counts and durations: label values come from fixed sets (route
patterns, status codes, results, the build), never from a request's content
(a path, an id, a command). tests/unit/daemon/test_metrics.py checks it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

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


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _num(v: float) -> str:
    return repr(float(v)) if v != int(v) or abs(v) >= 1e15 else f"{int(v)}.0"


@dataclass
class Counter:
    name: str
    help: str
    labelnames: tuple[str, ...] = ()
    values: dict[tuple[str, ...], float] = field(default_factory=dict)

    def inc(self, *labels: str, by: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + by

    def mirror(self, total: float, *labels: str) -> None:
        """Take a running total kept elsewhere (it only grows in one process)."""
        self.values[labels] = float(total)

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        for labels, v in sorted(self.values.items()):
            out.append(f"{self.name}{_labels(self.labelnames, labels)} {_num(v)}")
        return out


@dataclass
class Gauge:
    name: str
    help: str
    value: float = 0.0

    def set(self, v: float) -> None:
        self.value = v

    def render(self) -> list[str]:
        return [
            f"# HELP {self.name} {self.help}",
            f"# TYPE {self.name} gauge",
            f"{self.name} {_num(self.value)}",
        ]


@dataclass
class Info:
    """``NAME{labels} 1``: a constant series naming what answers."""

    name: str
    help: str
    labels: tuple[tuple[str, str], ...]

    def render(self) -> list[str]:
        names = tuple(k for k, _ in self.labels)
        values = tuple(v for _, v in self.labels)
        return [
            f"# HELP {self.name} {self.help}",
            f"# TYPE {self.name} gauge",
            f"{self.name}{_labels(names, values)} 1.0",
        ]


@dataclass
class Histogram:
    name: str
    help: str
    labelnames: tuple[str, ...]
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    # labels -> (per-bucket counts (last is +Inf), sum)
    series: dict[tuple[str, ...], tuple[list[int], list[float]]] = field(default_factory=dict)

    def observe(self, v: float, *labels: str) -> None:
        counts, total = self.series.setdefault(labels, ([0] * (len(self.buckets) + 1), [0.0]))
        counts[bisect.bisect_left(self.buckets, v)] += 1
        total[0] += v

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for labels, (counts, total) in sorted(self.series.items()):
            cumulative = 0
            for bound, n in zip((*self.buckets, float("inf")), counts, strict=True):
                cumulative += n
                le = 'le="' + ("+Inf" if bound == float("inf") else _num(bound)) + '"'
                lab = _labels(self.labelnames, labels, le)
                out.append(f"{self.name}_bucket{lab} {_num(cumulative)}")
            lab = _labels(self.labelnames, labels)
            out.append(f"{self.name}_sum{lab} {_num(total[0])}")
            out.append(f"{self.name}_count{lab} {_num(cumulative)}")
        return out


@dataclass(frozen=True)
class DaemonMetrics:
    build: Info
    requests: Counter
    request_seconds: Histogram
    commands: Counter
    orphans_reaped: Counter
    background: Gauge
    sessions: Gauge
    in_flight: Gauge

    @classmethod
    def create(cls, version: str) -> DaemonMetrics:
        return cls(
            # The components' sandman_build_info (sandman/telemetry/prom.py).
            build=Info(
                "sandman_build_info",
                "1 per running component, labelled with its build",
                (("component", "daemon"), ("version", version)),
            ),
            requests=Counter("sandman_daemon_requests_total", "API requests", ("route", "code")),
            request_seconds=Histogram(
                "sandman_daemon_request_duration_seconds", "API request latency", ("route",)
            ),
            commands=Counter(
                "sandman_daemon_commands_total", "commands run to completion", ("result",)
            ),
            orphans_reaped=Counter("sandman_daemon_orphans_reaped_total", "adopted orphans reaped"),
            background=Gauge("sandman_daemon_background_processes", "background processes tracked"),
            sessions=Gauge("sandman_daemon_sessions", "open shell sessions"),
            in_flight=Gauge("sandman_daemon_requests_in_flight", "API requests being served"),
        )

    def render(self) -> bytes:
        lines: list[str] = []
        for m in (
            self.build,
            self.requests,
            self.request_seconds,
            self.commands,
            self.orphans_reaped,
            self.background,
            self.sessions,
            self.in_flight,
        ):
            lines += m.render()
        return ("\n".join(lines) + "\n").encode()
