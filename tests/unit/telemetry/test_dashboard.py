"""The dashboard file and the PromQL name extraction used to check it."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from sandman.telemetry.promql import dashboard_exprs, metric_names, rule_exprs, sample_names

MONITORING = Path(__file__).resolve().parents[3] / "manifests" / "monitoring"


def test_metric_names_skip_functions_labels_ranges_groupings_and_keywords() -> None:
    e = (
        'histogram_quantile(0.99, sum by (le, endpoint) (rate(a_bucket{result="x",'
        'rule=~"b|c"}[$__rate_interval]))) / on (job) group_left (version) b_info'
        " or vector(0) > bool 1e3 unless c offset 5m and time() - d"
    )
    assert metric_names(e) == {"a_bucket", "b_info", "c", "d"}
    assert metric_names('up{job="sandman-webhook"} == 0 or absent(up{job="x"})') == {"up"}
    assert metric_names("(sum(x) or vector(0)) < 1") == {"x"}
    assert metric_names('sum(rate(m{a="sum(q)"}[5m])) by (le)') == {"m"}


def test_sample_names_read_an_exposition() -> None:
    text = '# HELP a_total x\n# TYPE a_total counter\na_total{k="v"} 1\nb 2\n'
    assert sample_names(text) == {"a_total", "b"}


def test_the_dashboard_is_well_formed_and_covers_what_the_issue_asks() -> None:
    d = json.loads((MONITORING / "sandman-dashboard.json").read_text())
    assert d["uid"] == "sandman-overview"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    # No two panels overlap on Grafana's 24-column grid.
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, p["title"]
        cells |= mine
    names = set().union(*(metric_names(e) for _, e in dashboard_exprs(d)))
    for wanted in (
        "sandman_webhook_admissions_total",  # admission rate
        "sandman_webhook_admission_duration_seconds_bucket",  # admission latency
        "sandman_webhook_rule_violations_total",  # denials by rule
        "sandman_sandboxes",  # by phase and namespace
        "sandman_pool_sandboxes",  # pool depth
        "sandman_pool_claim_duration_seconds_bucket",  # claim latency
        "sandman_pool_creates_total",  # create budget use
        "sandman_pool_create_budget_per_second",
        "sandman_reaper_reclaimed_total",  # reclaims by reason
        "sandman_extender_request_duration_seconds_bucket",  # extender latency
        "sandman_extender_placements_total",  # cache-hit ratio
        "sandman_daemon_request_duration_seconds_bucket",  # daemon exec latency
    ):
        assert wanted in names, wanted


def test_the_monitoring_kustomization_lists_its_files_and_stays_out_of_the_default() -> None:
    k = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    for f in k["resources"]:
        assert (MONITORING / f).exists(), f
    assert k["configMapGenerator"][0]["files"] == ["sandman-dashboard.json"]
    top = yaml.safe_load((MONITORING.parent / "kustomization.yaml").read_text())
    assert "monitoring" not in top["resources"]  # needs the Prometheus Operator's CRDs
    spec = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())["spec"]
    alerts = {name for name, _ in rule_exprs(spec)}
    assert {
        "SandmanWebhookDown",
        "SandmanWebhookCertExpiringSoon",
        "SandmanReaperNotLeading",
        "SandmanPoolFailing",
        "SandmanSandboxesStuckPending",
    } <= alerts
