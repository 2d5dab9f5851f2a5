"""Monitoring: Prometheus's own tools accept the alert rules (and fire them when
they should), and the dashboard and alerts name only metrics that the live
components export, scraped from a webhook, an extender, a reaper, a daemon
and an SDK process (pool manager) working on the test cluster."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, KWOK_TOLERATION, NODE_KIND_LABEL, on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.probes import insecure_context
from sandman.harness.testing import async_wait_for, free_port, kubectl, wait_for
from sandman.kube_async import PODS, ApiError, KubeClient
from sandman.pools import PoolSpec
from sandman.pools.manager import ManagerConfig, PoolManager
from sandman.telemetry import Telemetry
from sandman.telemetry.promql import dashboard_exprs, metric_names, rule_exprs, sample_names
from sandman.telemetry.sdkmetrics import SdkMetrics
from tests.unit.daemon.helpers import start_daemon, stop_daemon

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "manifests" / "monitoring"
ALERT_TESTS = Path(__file__).parent / "monitoring" / "alerts_test.yaml"
# Made by Prometheus itself for every target, not by a component.
SYNTHETIC = {"up"}


def promtool() -> str:
    path = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(path).exists():
        pytest.skip(
            "promtool missing (Debian package prometheus; python -m sandman.harness.prereqs)"
        )
    return path


def rule_spec() -> dict:
    return yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())["spec"]


def dashboard() -> dict:
    return json.loads((MONITORING / "sandman-dashboard.json").read_text())


def test_promtool_accepts_the_rules_and_each_alert_fires_when_it_should(tmp_path: Path) -> None:
    tool = promtool()
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_spec()))
    out = subprocess.run([tool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    alerts = [name for name, _ in rule_exprs(rule_spec())]
    assert f"SUCCESS: {len(alerts)} rules found" in out.stdout
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    tests["rule_files"] = [str(rules)]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    out = subprocess.run(
        [tool, "test", "rules", str(tmp_path / "tests.yaml")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # Every alert has at least one case where it fires.
    fired = {
        case["alertname"]
        for t in tests["tests"]
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert set(alerts) - fired <= {"SandmanWebhookSlow", "SandmanReclaimLagging",
                                   "SandmanWebhookCertExpiring"}  # fmt: skip


# -- the live scrape ----------------------------------------------------------------
def get(url: str) -> str:
    ctx = insecure_context() if url.startswith("https") else None
    with urllib.request.urlopen(url, timeout=10, context=ctx) as r:
        return r.read().decode()


@pytest.fixture
def reaper(cluster: LocalCluster, namespace: str, tmp_path: Path) -> Iterator[int]:
    """A reaper scoped to the test's namespace (it leads at once: no election)."""
    port = free_port()
    log = (tmp_path / "reaper.log").open("wb")
    argv = [
        sys.executable, "-m", "sandman.reaper", "serve", f"--listen=127.0.0.1:{port}",
        f"--kubeconfig={cluster.kubeconfig}", f"--namespace={namespace}",
        f"--watch-namespace={namespace}", "--no-leader-elect",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def ready() -> bool:
        assert proc.poll() is None, (tmp_path / "reaper.log").read_text()[-3000:]
        try:
            return "ok" in get(f"http://127.0.0.1:{port}/readyz")
        except OSError:
            return False

    try:
        wait_for(ready, timeout=60, what="the reaper's /readyz")
        yield port
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


@pytest.fixture
async def kube(cluster: LocalCluster) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(cluster.kubeconfig) as k:
        yield k


async def test_dashboard_and_alerts_name_only_metrics_the_components_export(
    cluster: LocalCluster, namespace: str, kube: KubeClient, reaper: int, tmp_path: Path
) -> None:
    # A daemon (the same code the sandbox image runs) that served one command.
    daemon = start_daemon(tmp_path)
    try:
        assert daemon.exec(["true"])["exit_code"] == 0
        # Without a token, as a PodMonitor scrapes it.
        daemon_text = daemon.ok("GET", "/metrics", token="").decode()
    finally:
        stop_daemon(daemon)

    # An SDK process's pool manager: a warm pool on kwok nodes, one claim.
    tel = Telemetry(metrics=SdkMetrics(), listen=("127.0.0.1", 0))
    await tel.start()
    try:
        pm = PoolManager(kube, namespace, ManagerConfig(tick_s=0.1), telemetry=tel)
        async with pm:
            await pm.ensure(
                PoolSpec("warm", KWOK_IMAGE, size=2, command=["sleep", "infinity"],
                         node_selector={NODE_KIND_LABEL: "kwok"}, tolerations=[KWOK_TOLERATION])
            )  # fmt: skip
            await async_wait_for(
                lambda: pm.health("warm").ready >= 1, timeout=90, what="a Ready pool pod"
            )
            await pm.claim("warm", claimer="monitoring-test", ttl=dt.timedelta(minutes=5))
            # Served on this event loop: read it without blocking the loop.
            url = f"http://127.0.0.1:{tel.port}/metrics"
            async with aiohttp.ClientSession() as http, http.get(url) as r:
                sdk_text = await r.text()
    finally:
        await tel.aclose()

    # A sandbox that stays Pending (no node has this label) and a denied one.
    pending = {
        "metadata": {"name": "nowhere", "labels": {"sandman.dev/sandbox": "true"}},
        "spec": on_kwok(
            {"containers": [{"name": "main", "image": KWOK_IMAGE}],
             "nodeSelector": {"sandman.dev/test-no-such-node": "x"}}
        ),
    }  # fmt: skip
    await kube.create(PODS, pending, namespace)
    denied = {
        "metadata": {"name": "denied", "labels": {"sandman.dev/sandbox": "true"}},
        "spec": on_kwok(
            {"containers": [{"name": "main", "image": KWOK_IMAGE,
                             "securityContext": {"privileged": True}}]}
        ),
    }  # fmt: skip
    with pytest.raises(ApiError) as e:
        await kube.create(PODS, denied, namespace)
    assert e.value.status == 403

    def reaper_inventory() -> str | None:
        try:
            text = get(f"http://127.0.0.1:{reaper}/metrics")
        except OSError as e:
            pytest.fail(f"the reaper stopped answering: {e}")
        ok = (
            "sandman_pool_sandboxes{" in text
            and "sandman_sandboxes_pending_oldest_seconds{" in text
        )
        return text if ok else None

    reaper_text = wait_for(reaper_inventory, timeout=60, what="the reaper's inventory")
    # Host processes or pods (in-cluster), wherever this cluster runs them.
    deployment = cluster.deployment
    assert deployment is not None
    webhook_text = get(deployment.metrics_urls("webhook")[0])
    extender_url = deployment.metrics_urls("extender")[0]
    extender_text = wait_for(
        lambda: (t := get(extender_url)) and "sandman_extender_placements_total{" in t and t,
        timeout=30,
        what="an extender placement",
    )
    apiserver_text = kubectl(cluster, "get", "--raw", "/metrics")

    scrapes = {
        "webhook": webhook_text,
        "extender": extender_text,
        "reaper": reaper_text,
        "daemon": daemon_text,
        "sdk": sdk_text,
    }
    tool = promtool()
    for component, text in scrapes.items():
        assert f'sandman_build_info{{component="{component}"' in text, component
        # Prometheus's linter: counters end in _total, units in base units, HELP present.
        lint = subprocess.run(
            [tool, "check", "metrics"], input=text, capture_output=True, text=True
        )
        assert lint.returncode == 0, f"{component}: {lint.stdout}{lint.stderr}"

    exported = set().union(*(sample_names(t) for t in scrapes.values()))
    external = sample_names(apiserver_text) | SYNTHETIC
    for title, expr in dashboard_exprs(dashboard()):
        missing = metric_names(expr) - exported
        assert not missing, f"dashboard panel {title!r} reads {missing}, which nothing exports"
    for name, expr in rule_exprs(rule_spec()):
        missing = metric_names(expr) - exported - external
        assert not missing, f"alert {name} reads {missing}, which nothing exports"
    # The apiserver's webhook rejection counter exists (the denial above made one).
    assert "apiserver_admission_webhook_rejection_count" in external
