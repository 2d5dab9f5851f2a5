"""Sandbox-start phases (pure) and their spans, through the OpenTelemetry SDK's
in-memory exporter; the OTLP wire path is tested against a receiver in e2e."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import aiohttp
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sandman.telemetry import Telemetry
from sandman.telemetry.phases import Pull, go_duration, pulls, start_trace
from sandman.telemetry.sdkmetrics import SdkMetrics
from sandman.telemetry.tracing import NO_TRACING, OtlpTracing, from_env


@dataclass
class T:
    requested: float = 100.0
    created: float | None = None
    scheduled: float | None = None
    started: float | None = None
    ready: float | None = None
    first_result: float | None = None


POD = {
    "metadata": {
        "name": "sandbox-x",
        "namespace": "rl",
        "uid": "u1",
        "labels": {"sandman.dev/id": "abc"},
    },
    "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "r/swe:1"}]},
}
PULLED = {
    "reason": "Pulled",
    "message": 'Successfully pulled image "r/swe:1" in 1.5s (1.5s including waiting). '
    "Image size: 123 bytes.",
}
PRESENT = {"reason": "Pulled", "message": 'Container image "r/daemon:1" already present on machine'}


def test_go_durations_and_kubelet_pull_messages() -> None:
    assert go_duration("1.5s") == 1.5
    assert go_duration("532ms") == pytest.approx(0.532)
    assert go_duration("1m2.5s") == 62.5
    assert go_duration("850.5µs") == pytest.approx(0.0008505)
    assert go_duration("soon") is None and go_duration("") is None
    assert pulls([PULLED, PRESENT, {"reason": "Started", "message": "x"}]) == [
        Pull("r/swe:1", 1.5),
        Pull("r/daemon:1", 0.0),
    ]


def test_a_created_sandbox_has_every_phase_with_the_kubelets_pull_time() -> None:
    # requested 100.0, admitted 100.1, scheduled 100.2, running 102.2, Ready
    # 102.5, first result 102.6; the kubelet pulled for 1.5 s -> pulled 101.7.
    t = T(100.0, 100.1, 100.2, 102.2, 102.5, 102.6)
    st = start_trace(t, POD, [PULLED, PRESENT])
    assert st.source == "created"
    got = [(p.name, round(p.start, 3), round(p.end, 3)) for p in st.phases]
    assert got == [
        ("create", 100.0, 100.1),
        ("schedule", 100.1, 100.2),
        ("pull", 100.2, 101.7),
        ("start", 101.7, 102.2),
        ("ready", 102.2, 102.5),
        ("first_command", 102.5, 102.6),
    ]
    assert [n for n, _ in st.instants] == [
        "admitted",
        "scheduled",
        "pulled",
        "started",
        "ready",
        "first_command",
    ]
    assert st.attributes["sandman.pull.seconds"] == 1.5
    assert st.attributes["sandman.pull.cached"] == [False, True]
    assert st.attributes["k8s.node.name"] == "node-1"


def test_pull_is_capped_at_the_start_and_missing_phases_are_skipped() -> None:
    # The Events say 9 s but the container ran 2 s after scheduling: capped.
    slow = {"reason": "Pulled", "message": 'Successfully pulled image "r/swe:1" in 9s (9s ...)'}
    st = start_trace(T(100.0, 100.1, 100.2, 102.2, 102.5), POD, [slow])
    assert [(p.name, round(p.end, 3)) for p in st.phases][2] == ("pull", 102.2)
    # A warm pod claimed Ready: claim, then the first command.
    pooled = {**POD, "metadata": {**POD["metadata"], "labels": {"sandman.dev/pool": "p"}}}
    st = start_trace(T(100.0, 100.02, first_result=100.05), pooled)
    assert st.source == "claimed"
    assert [p.name for p in st.phases] == ["claim", "first_command"]
    # A sandbox reset for its next rollout: only the first command.
    st = start_trace(T(200.0, first_result=200.3), POD)
    assert st.source == "reused" and [p.name for p in st.phases] == ["first_command"]


def tracing() -> tuple[OtlpTracing, InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    return OtlpTracing(exp, batch=False, wall_offset_ns=lambda: 0), exp


def test_spans_of_a_start_nest_under_one_root_with_wall_times() -> None:
    tr, exp = tracing()
    tr.record_start(POD, T(100.0, 100.1, 100.2, 102.2, 102.5, 102.6), [PULLED])
    spans = {s.name: s for s in exp.get_finished_spans()}
    root = spans["sandman.sandbox"]
    assert set(spans) == {
        "sandman.sandbox",
        "create",
        "schedule",
        "pull",
        "start",
        "ready",
        "first_command",
    }
    for name in ("create", "pull", "first_command"):
        assert spans[name].parent.span_id == root.context.span_id
        assert spans[name].context.trace_id == root.context.trace_id
    assert root.start_time == 100_000_000_000 and root.end_time == 102_600_000_000
    assert spans["pull"].end_time - spans["pull"].start_time == 1_500_000_000
    assert root.attributes["sandman.sandbox.id"] == "abc"
    assert [e.name for e in root.events][:2] == ["admitted", "scheduled"]


def test_a_failed_start_is_an_error_span() -> None:
    tr, exp = tracing()
    err = SimpleNamespace(reason="ImageNotFound", retryable=False)
    tr.record_start(POD, T(100.0, 100.1, 100.2), [], error=err)  # type: ignore[arg-type]
    root = next(s for s in exp.get_finished_spans() if s.name == "sandman.sandbox")
    assert root.status.status_code.name == "ERROR"
    assert root.attributes["sandman.error.reason"] == "ImageNotFound"
    assert root.attributes["sandman.error.retryable"] is False


def test_a_rollout_is_its_own_trace_and_the_sandbox_nests_under_it() -> None:
    tr, exp = tracing()
    attempt = SimpleNamespace(
        source="created",
        sandbox="sandbox-x",
        t_requested=1.0,
        t_acquired=3.0,
        t_done=5.0,
        error_reason=None,
        retryable=None,
    )
    rec = SimpleNamespace(
        problem="p0",
        rollout=2,
        t_queued=0.5,
        attempts=[attempt],
        outcome="ok",
        reward=1.0,
        detail="",
    )
    with tr.rollout("run1", rec, t0=100.0):
        tr.record_start(POD, T(101.0, 101.1, 101.2, 102.0, 102.5, 103.1), [])
    spans = exp.get_finished_spans()
    by = {s.name: s for s in spans}
    roll = by["sandman.rollout"]
    assert roll.parent is None
    assert by["sandman.sandbox"].parent.span_id == roll.context.span_id
    assert by["attempt"].parent.span_id == roll.context.span_id
    assert by["task"].parent.span_id == by["attempt"].context.span_id
    assert by["task"].start_time == 103_000_000_000  # t0 100 + acquired 3
    assert roll.attributes["sandman.outcome"] == "ok"
    assert roll.attributes["sandman.run.id"] == "run1"


def test_tracing_is_off_unless_an_endpoint_is_set() -> None:
    assert from_env({}) is NO_TRACING
    ep = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert from_env({**ep, "OTEL_SDK_DISABLED": "true"}) is NO_TRACING
    assert from_env({**ep, "OTEL_TRACES_EXPORTER": "none"}) is NO_TRACING
    on = from_env(ep)
    assert isinstance(on, OtlpTracing)
    on.provider.shutdown()


def test_no_opentelemetry_or_prometheus_import_when_nothing_is_configured() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SANDMAN_METRICS"))}
    code = (
        "import sys, ssl\n"
        "from sandman.client import SandmanClient\n"
        "import sandman.fleet.fleet\n"
        "from sandman.kube_async import Credentials, KubeClient\n"
        "creds = Credentials('https://127.0.0.1:1', ssl.create_default_context())\n"
        "c = SandmanClient(kube=KubeClient(creds))\n"
        "print(sorted({m.split('.')[0] for m in sys.modules}"
        " & {'opentelemetry', 'prometheus_client'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


class FakeLimiter:
    def __init__(self, on_demand: int, refill: int) -> None:
        self.granted = {"on_demand": on_demand, "refill": refill}
        self.waiting = 1


class Manager:
    """What SdkMetrics reads of a PoolManager (its limiter and config)."""

    def __init__(self, on_demand: int, refill: int) -> None:
        self.limiter = FakeLimiter(on_demand, refill)
        self.config = SimpleNamespace(create_rate=20.0)


async def test_sdk_metrics_endpoint_serves_claims_and_the_budget() -> None:
    m = SdkMetrics()
    a, b = Manager(3, 5), Manager(1, 0)
    m.watch(a)
    m.watch(b)
    m.claim_done("ok", 0.01)
    m.forget(b)  # its grants stay counted
    b.limiter.granted["on_demand"] = 99  # ... as they were when it left
    port = await m.serve("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
            text = await r.text()
    finally:
        await m.aclose()
    lines = set(text.splitlines())
    assert 'sandman_pool_creates_total{kind="on_demand"} 4.0' in lines
    assert 'sandman_pool_creates_total{kind="refill"} 5.0' in lines
    assert "sandman_pool_create_budget_per_second 20.0" in lines
    assert "sandman_pool_create_waiting 1.0" in lines
    assert 'sandman_pool_claim_duration_seconds_count{result="ok"} 1.0' in lines
    assert any(x.startswith('sandman_build_info{component="sdk"') for x in lines)


def test_a_bad_metrics_address_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="SANDMAN_METRICS_LISTEN"):
        Telemetry.from_env({"SANDMAN_METRICS_LISTEN": "nope"})
    t = Telemetry.from_env({"SANDMAN_METRICS_LISTEN": "127.0.0.1:0"})
    assert t.metrics is not None and t.listen == ("127.0.0.1", 0)
