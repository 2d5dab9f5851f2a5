"""The daemon's auth table and its token-less /metrics, against a real daemon.

/metrics is open so that a Prometheus PodMonitor can scrape every sandbox
(it cannot hold a token per sandbox). What it may show is counts and
durations labelled from fixed sets, never a request's content; every other
route but the probes and the reaper's idle figure needs the token.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sandman.daemon import __version__
from sandman.daemon.api import ROUTES
from sandman.daemon.server import OPEN_PATHS, PASSIVE_PATHS
from sandman.harness.testing import wait_for
from tests.unit.daemon.helpers import Daemon

OPEN = {"/healthz", "/readyz", "/v1/idle", "/metrics"}
# Every label the daemon's series may carry, each from a fixed set of values.
LABELS = {"route", "code", "result", "le", "component", "version"}


def test_only_probes_idle_and_metrics_are_open_every_other_route_needs_the_token(
    daemon: Daemon,
) -> None:
    assert OPEN_PATHS == OPEN
    for method, pattern in ROUTES:
        path = pattern.replace("{id}", "x")
        for token in ("", "wrong"):
            status, doc = daemon.request(method, path, token=token)
            if pattern in OPEN:
                assert status == 200, (method, path, status, doc)
            else:
                assert status == 401, (method, path, status, doc)
                assert doc["error"]["code"] == "unauthorized"


def test_metrics_without_a_token_are_counts_by_fixed_labels_only(
    daemon: Daemon, tmp_path: Path
) -> None:
    secret = "sandbox-content-3f9a"
    (tmp_path / f"{secret}.txt").write_text(secret)
    # Use that names content: a command, a file path, an unknown endpoint, ids.
    assert daemon.exec(["echo", secret])["stdout"] == f"{secret}\n"
    daemon.ok("GET", f"/v1/files?path={tmp_path}/{secret}.txt")
    daemon.request("GET", f"/v1/{secret}")
    daemon.request("GET", f"/v1/processes/{secret}")
    # An orphan for the reaped counter: its parent exits at once.
    daemon.exec("sleep 0.1 & exit 0")
    wait_for(lambda: daemon.ok("GET", "/v1/status")["orphans_reaped"] >= 1, timeout=30,
             what="an orphan reaped")  # fmt: skip
    calls = daemon.ok("GET", "/v1/status")["api_calls"]

    status, body = daemon.request("GET", "/metrics", token="")
    assert status == 200
    text = body.decode()
    assert secret not in text and str(tmp_path) not in text
    patterns = {p for _, p in ROUTES} | {"?"}
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for family in families.values():
        assert family.name == "sandman_build_info" or family.name.startswith("sandman_daemon_")
        for sample in family.samples:
            assert set(sample.labels) <= LABELS, sample
            assert sample.labels.get("route", "?") in patterns, sample
            assert sample.labels.get("code", "200").isdigit(), sample
    # Scraping is not using: the idle rule does not count it.
    assert daemon.ok("GET", "/v1/status")["api_calls"] == calls
    assert "/metrics" in PASSIVE_PATHS

    # Names as prometheus-client reads them: a counter's samples end in _total.
    orphans = families["sandman_daemon_orphans_reaped"]
    assert orphans.type == "counter"
    [sample] = orphans.samples
    assert sample.name == "sandman_daemon_orphans_reaped_total" and sample.value >= 1
    build = families["sandman_build_info"]
    assert build.type == "gauge"
    assert [(s.labels, s.value) for s in build.samples] == [
        ({"component": "daemon", "version": __version__}, 1.0)
    ]
    for name in ("sandman_daemon_requests", "sandman_daemon_commands"):
        assert families[name].type == "counter"
        assert all(s.name == f"{name}_total" for s in families[name].samples)
