"""Observability on the real node: a sandbox's start arrives as an OTLP trace at
a receiver on loopback, and its daemon exports what the dashboard reads."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from sandman.client import Sandbox, SandmanClient
from sandman.contract import DAEMON_PORT
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.telemetry.promql import dashboard_exprs, metric_names, sample_names
from tests.otlp_receiver import OtlpReceiver

REAL = {"sandman.dev/node-kind": "real"}
DASHBOARD = Path(__file__).resolve().parents[2] / "manifests/monitoring/sandman-dashboard.json"
PHASES = ["create", "schedule", "pull", "start", "ready", "first_command"]


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    for var in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "sandman-e2e")
    yield r
    r.close()


async def test_a_sandbox_start_is_traced_and_its_daemon_exports_the_dashboards_metrics(
    cluster: LocalCluster,
    real_node: RealNode,
    images: dict[str, str],
    namespace: str,
    receiver: OtlpReceiver,
) -> None:
    async with SandmanClient(kubeconfig=cluster.kubeconfig, namespace=namespace) as client:
        assert client.telemetry.tracing.enabled
        sb = await Sandbox.create(
            client, images["tiny"], node_selector=REAL, command=["sleep", "600"], ttl="10m"
        )
        try:
            assert (await sb.exec(["true"])).exit_code == 0
            # Straight at the pod, as Prometheus would: no token (a PodMonitor
            # cannot hold one per sandbox; the host is on the pod bridge).
            url = f"http://{sb.ip}:{DAEMON_PORT}/metrics"
            async with aiohttp.ClientSession() as http, http.get(url) as r:
                assert r.status == 200
                daemon_text = await r.text()
        finally:
            await sb.release()
        # Closing the client waits for the trace (one Event list) and flushes it.

    roots = [s for s in receiver.spans if s.name == "sandman.sandbox"]
    assert len(roots) == 1, receiver.spans
    root = roots[0]
    assert root.service == "sandman-e2e"
    assert root.attributes["k8s.pod.name"] == sb.name
    assert root.attributes["sandman.source"] == "created"
    kids = sorted(
        (s for s in receiver.spans if s.parent_id == root.span_id), key=lambda s: s.start_ns
    )
    assert [s.name for s in kids] == PHASES
    assert all(s.trace_id == root.trace_id for s in kids)
    # Consecutive phases tile the root exactly: create starts it, first_command ends it.
    assert kids[0].start_ns == root.start_ns and kids[-1].end_ns == root.end_ns
    for a, b in itertools.pairwise(kids):
        assert a.end_ns == b.start_ns
    assert list(root.events) == [
        "admitted", "scheduled", "pulled", "started", "ready", "first_command"
    ]  # fmt: skip
    # The kubelet reported its pulls (the daemon's image and the task's).
    assert root.attributes["sandman.pull.images"]
    # The daemon side of the dashboard: every sandman_daemon_* name it reads.
    wanted = {
        n
        for _, e in dashboard_exprs(json.loads(DASHBOARD.read_text()))
        for n in metric_names(e)
        if n.startswith("sandman_daemon_")
    }
    assert wanted and wanted <= sample_names(daemon_text)
    assert 'route="/v1/exec"' in daemon_text
    assert 'sandman_build_info{component="daemon"' in daemon_text
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    lint = subprocess.run([promtool, "check", "metrics"], input=daemon_text, capture_output=True,
                          text=True)  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr
