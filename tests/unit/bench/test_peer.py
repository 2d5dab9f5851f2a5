"""The side-by-side bench's pure parts: the peer's objects, ratios and targets."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sandman.bench.peer import compare, objects
from sandman.bench.peer import controller as peer_ctl
from sandman.bench.peer.compare import Row, Target


def test_ratio_says_how_many_times_better_ours_is_for_latencies_and_rates() -> None:
    assert compare.ratio(100.0, 500.0, "lower") == 5.0  # ours 100 ms, theirs 500 ms
    assert compare.ratio(500.0, 100.0, "lower") == 0.2  # ours slower: below 1
    assert compare.ratio(30.0, 20.0, "higher") == 1.5  # ours 30/s, theirs 20/s
    assert compare.ratio(10.0, 20.0, "higher") == 0.5
    assert compare.ratio(0.0, 0.0, "lower") == 1.0  # 0 lost each: a tie
    assert compare.ratio(0.0, 3.0, "lower") == math.inf  # ours lost none, theirs 3
    assert compare.ratio(None, 3.0, "lower") is None
    assert compare.ratio(1.0, float("nan"), "lower") is None


def test_json_keys_has_ours_peer_and_ratio_for_every_row() -> None:
    rows = [
        Row("cold_1_ready_p50_ms", 400.0, 800.0, "lower"),
        Row("burst_claims_per_s", None, 40.0, "higher", why_missing="not run"),
    ]
    assert compare.json_keys(rows) == {
        "ours_cold_1_ready_p50_ms": 400.0,
        "peer_cold_1_ready_p50_ms": 800.0,
        "ratio_cold_1_ready_p50_ms": 2.0,
        "ours_burst_claims_per_s": None,
        "peer_burst_claims_per_s": 40.0,
        "ratio_burst_claims_per_s": None,
        "missing_burst_claims_per_s": "not run",
    }


def test_verdicts_name_each_row_below_its_bar() -> None:
    targets = (Target("warm 5x", ("a", "b"), 5.0), Target("burst 1.5x", ("c",), 1.5))
    rows = [
        Row("a", 10.0, 100.0, "lower"),  # 10x: met
        Row("b", 50.0, 100.0, "lower"),  # 2x: short
        Row("c", 60.0, 30.0, "higher"),  # 2x: met
    ]
    v = compare.verdicts(rows, targets)
    assert (v[0].met, v[0].short) == (False, ["b: 2x (needs 5x)"])
    assert (v[1].met, v[1].short) == (True, [])


def test_a_verdict_is_unknown_when_a_row_was_not_measured_and_none_failed() -> None:
    v = compare.verdicts([Row("a", 1.0, 9.0, "lower")], (Target("t", ("a", "z"), 5.0),))
    assert v[0].met is None
    assert v[0].short == ["z: not measured"]


def test_every_target_names_rows_the_bench_writes() -> None:
    # The row keys the bench builds (see bench/peer/__init__.py); a target naming
    # a key no row has would read "not measured" forever.
    written = set()
    for n in (1, 16):
        for q in ("p50", "p99"):
            written.add(f"cold_{n}_first_command_vs_ready_{q}_ms")
    for n in (1, 8, 32):
        for q in ("p50", "p99"):
            written.add(f"warm_{n}_claim_first_command_vs_ready_{q}_ms")
    written |= {
        "burst_claims_per_s",
        "burst_creates_per_s",
        "lifecycle_apiserver_requests",
        "lifecycle_apiserver_cpu_s",
        "rl_pods_created",
        "rl_wall_s",
    }
    for t in compare.TARGETS:
        assert set(t.keys) <= written, t.text


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "sandboxes.agents.x-k8s.io"},
    "spec": {
        "group": "agents.x-k8s.io",
        "conversion": {"strategy": "Webhook", "webhook": {"clientConfig": {}}},
        "versions": [
            {"name": "v1beta1", "served": True, "storage": True, "schema": {"x": 1}},
            {"name": "v1alpha1", "served": True, "storage": False, "schema": {"y": 2}},
        ],
    },
}


def test_served_crd_keeps_the_storage_version_and_drops_the_conversion_webhook() -> None:
    out = objects.served_crd(CRD)
    assert [v["name"] for v in out["spec"]["versions"]] == ["v1beta1"]
    assert out["spec"]["versions"][0]["schema"] == {"x": 1}
    assert "conversion" not in out["spec"]
    assert "conversion" in CRD["spec"]  # the input is left as it was


def test_served_crd_without_the_version_says_which_it_has() -> None:
    with pytest.raises(ValueError, match=r"no version v9 \(has \['v1beta1', 'v1alpha1'\]\)"):
        objects.served_crd(CRD, "v9")


def test_reading_a_claim_and_its_sandbox() -> None:
    claim = {
        "metadata": {"name": "c1"},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "sandbox": {"name": "pool-abc"},
        },
    }
    assert objects.is_ready(claim)
    assert objects.claimed_sandbox(claim) == "pool-abc"
    assert objects.claimed_sandbox({"metadata": {"name": "c2"}, "status": {}}) is None
    assert not objects.is_ready({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    adopted = {"metadata": {"name": "s", "annotations": {objects.POD_NAME_ANNOTATION: "pod-x"}}}
    assert objects.sandbox_pod(adopted) == "pod-x"
    assert objects.sandbox_pod({"metadata": {"name": "s"}}) == "s"


def test_claim_and_pool_shapes_follow_the_v1beta1_types() -> None:
    assert objects.claim("c", "p")["spec"] == {"warmPoolRef": {"name": "p"}}
    assert objects.warm_pool("p", "t", 3)["spec"] == {
        "replicas": 3,
        "sandboxTemplateRef": {"name": "t"},
    }
    tpl = objects.pod_template("img", ["sleep", "1"], node_selector={"k": "v"})
    assert tpl["spec"]["containers"] == [
        {"name": "main", "image": "img", "command": ["sleep", "1"]}
    ]
    assert tpl["spec"]["nodeSelector"] == {"k": "v"}


def test_a_missing_or_wrong_peer_source_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(peer_ctl.PeerError, match="--peer-src"):
        peer_ctl.check_source(tmp_path)
    assert peer_ctl.default_source(tmp_path / "repo") is None


def test_source_digest_changes_with_go_sources_only(tmp_path: Path) -> None:
    (tmp_path / "go.mod").write_text("module x\n")
    (tmp_path / "main.go").write_text("package main\n")
    (tmp_path / "README.md").write_text("a\n")
    d0 = peer_ctl.source_digest(tmp_path)
    (tmp_path / "README.md").write_text("b\n")
    (tmp_path / "main_test.go").write_text("package main\n")
    assert peer_ctl.source_digest(tmp_path) == d0
    (tmp_path / "main.go").write_text("package main // changed\n")
    assert peer_ctl.source_digest(tmp_path) != d0
