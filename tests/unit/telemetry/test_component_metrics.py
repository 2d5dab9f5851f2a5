"""Metric types of the components: one count per admission, counters for running
totals, build info everywhere, the extender's cache outcome, the reaper's inventory."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sandman.extender.index import NodeFacts, PodFacts
from sandman.extender.metrics import ExtenderMetrics, cache_outcome
from sandman.reaper.metrics import ReaperMetrics
from sandman.telemetry.inventory import take
from sandman.telemetry.prom import CounterMirror
from sandman.webhook.metrics import WebhookMetrics

NOW = dt.datetime(2025, 6, 1, 12, 0, 0, tzinfo=dt.UTC)


def samples(registry: CollectorRegistry) -> dict[str, float]:
    """'name{a="x",b="y"}' (labels sorted) -> value, from the text a scrape returns."""
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def types(registry: CollectorRegistry) -> dict[str, str]:
    return {
        f.name: f.type for f in text_string_to_metric_families(generate_latest(registry).decode())
    }


# -- webhook -------------------------------------------------------------------------
def test_one_admission_counts_once_however_many_rules_it_broke() -> None:
    m = WebhookMetrics.create()
    denied = SimpleNamespace(result="denied", rule_ids=["privileged", "registry"])
    m.observe("validate", denied, 0.002)
    m.observe("mutate", SimpleNamespace(result="injected", rule_ids=[]), 0.001)
    m.malformed("mutate")
    s = samples(m.registry)
    assert s['sandman_webhook_admissions_total{endpoint="validate",result="denied"}'] == 1
    assert s['sandman_webhook_admissions_total{endpoint="mutate",result="injected"}'] == 1
    assert s['sandman_webhook_admissions_total{endpoint="mutate",result="malformed"}'] == 1
    # 3 reviews in all, whatever the rules: the admission rate is one sum.
    total = sum(v for k, v in s.items() if k.startswith("sandman_webhook_admissions_total{"))
    assert total == 3
    prefix = 'sandman_webhook_rule_violations_total{endpoint="validate",result="denied",'
    viol = {k: v for k, v in s.items() if k.startswith("sandman_webhook_rule_violations_total{")}
    assert viol == {prefix + 'rule="privileged"}': 1, prefix + 'rule="registry"}': 1}
    assert s['sandman_webhook_admission_duration_seconds_count{endpoint="validate"}'] == 1


def test_webhook_running_totals_are_counters_and_build_info_is_set() -> None:
    m = WebhookMetrics.create()
    state = SimpleNamespace(
        certs=SimpleNamespace(not_after=NOW),
        policy=SimpleNamespace(reloads=2, errors=1, rejected="line 3: mode: ..."),
        recorder=SimpleNamespace(dropped=0),
    )
    m.refresh(state)
    assert samples(m.registry)["sandman_webhook_policy_rejected"] == 1
    state.policy.reloads = 5
    state.policy.rejected = None
    m.refresh(state)
    s = samples(m.registry)
    assert s["sandman_webhook_policy_reloads_total"] == 5
    assert s["sandman_webhook_policy_errors_total"] == 1
    assert s["sandman_webhook_policy_rejected"] == 0
    assert s["sandman_webhook_events_dropped_total"] == 0
    assert s["sandman_webhook_cert_expiry_timestamp_seconds"] == NOW.timestamp()
    t = types(m.registry)
    for name in ("sandman_webhook_policy_reloads", "sandman_webhook_admissions"):
        assert t[name] == "counter"  # the parser drops the _total suffix from family names
    assert any(k.startswith('sandman_build_info{component="webhook",version=') for k in s)


def test_counter_mirror_adds_what_the_source_counted_and_survives_a_new_source() -> None:
    r = CollectorRegistry()
    c = Counter("x_total", "x", ["verb"], registry=r)
    m = CounterMirror(c)
    m.update(3, "GET")
    m.update(7, "GET")  # +4
    m.update(2, "GET")  # a new source (it restarted) that counted 2 so far: +2
    m.update(0, "LIST")  # the series exists at 0
    s = samples(r)
    assert s['x_total{verb="GET"}'] == 9
    assert s['x_total{verb="LIST"}'] == 0


# -- extender ------------------------------------------------------------------------
def facts(total: int, per_node: dict[str, NodeFacts], default: NodeFacts | None = None) -> PodFacts:
    return PodFacts((), total, per_node, "img", default or NodeFacts())


def test_cache_outcome_of_the_top_ranked_node() -> None:
    # A 3 GB image: n1 holds all 3 GB -> hit; n2 holds 1 of 3 GB -> partial;
    # n3 pulls it -> pulling; n4 has nothing while n1 has it -> miss.
    f = facts(
        3_000,
        {
            "n1": NodeFacts(held_bytes=3_000),
            "n2": NodeFacts(held_bytes=1_000),
            "n3": NodeFacts(pulling_bytes=3_000),
        },
    )
    assert [cache_outcome(f, n) for n in ("n1", "n2", "n3", "n4")] == [
        "hit",
        "partial",
        "pulling",
        "miss",
    ]
    # Nobody holds or pulls any of it: no placement could hit -> cold.
    assert cache_outcome(facts(3_000, {}), "n1") == "cold"
    # Most candidates hold it (the default), the winner among them -> hit.
    assert cache_outcome(facts(3_000, {}, NodeFacts(held_bytes=3_000)), "n9") == "hit"
    assert cache_outcome(facts(0, {}), "n1") == "cold"  # a pod with no image to hold


def test_extender_counts_placements_and_exports_build_info() -> None:
    m = ExtenderMetrics.create()
    m.observe_placement(facts(10, {"n1": NodeFacts(held_bytes=10)}), "n1")
    m.observe_placement(facts(10, {"n1": NodeFacts(held_bytes=10)}), None)  # no candidate
    s = samples(m.registry)
    assert s['sandman_extender_placements_total{cache="hit"}'] == 1
    assert any(k.startswith('sandman_build_info{component="extender"') for k in s)


# -- reaper --------------------------------------------------------------------------
def pod(
    name: str,
    ns: str = "a",
    phase: str = "Running",
    *,
    created: str = "2025-06-01T11:50:00Z",
    labels: dict[str, str] | None = None,
    ready: bool = False,
    deleting: bool = False,
    waiting: str | None = None,
) -> dict[str, Any]:
    md: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "creationTimestamp": created,
        "labels": {"sandman.dev/sandbox": "true", **(labels or {})},
    }
    if deleting:
        md["deletionTimestamp"] = "2025-06-01T11:59:00Z"
    status: dict[str, Any] = {"phase": phase}
    if ready:
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    if waiting:
        status["containerStatuses"] = [
            {
                "name": "main",
                "image": "x",
                "state": {"waiting": {"reason": waiting, "message": "m"}},
            }
        ]
    return {"metadata": md, "status": status}


def test_inventory_counts_phases_pending_age_and_pool_states() -> None:
    idle = {"sandman.dev/pool": "p", "sandman.dev/state": "idle"}
    claimed = {"sandman.dev/pool": "p", "sandman.dev/state": "claimed"}
    bad = {"sandman.dev/pool": "q", "sandman.dev/state": "idle"}
    inv = take(
        [
            pod("r1"),
            pod("r2", deleting=True),
            pod("p1", phase="Pending", created="2025-06-01T11:45:00Z"),  # 15 min old
            pod("p2", phase="Pending", created="2025-06-01T11:58:00Z"),
            pod("b1", ns="b", phase="Pending", created="2025-06-01T11:59:30Z"),  # 30 s
            pod("w1", labels=idle, ready=True),
            pod("w2", labels=idle, phase="Pending"),
            pod("w3", labels=claimed, ready=True),
            pod("f1", labels=bad, phase="Pending", waiting="InvalidImageName"),
        ],
        NOW,
    )
    # a: r1, w1, w3 Running; r2 Terminating; p1, p2, w2, f1 Pending. b: b1 Pending.
    assert inv.sandboxes == {
        ("a", "Running"): 3,
        ("a", "Terminating"): 1,
        ("a", "Pending"): 4,
        ("b", "Pending"): 1,
    }
    assert inv.pending_oldest_s == {"a": 900.0, "b": 30.0}
    assert inv.pools[("a", "p", "ready")] == 1  # the pool's depth
    assert inv.pools[("a", "p", "starting")] == 1
    assert inv.pools[("a", "p", "claimed")] == 1
    assert inv.pools[("a", "q", "failing")] == 1
    assert inv.pool_failing == {("a", "p"): 0, ("a", "q"): 1}


def test_reaper_exports_the_inventory_only_when_given_its_cache() -> None:
    m = ReaperMetrics.create()
    m.refresh({"GET": 3, "DELETE": 1}, ([pod("r1")], NOW))
    s = samples(m.registry)
    assert s['sandman_sandboxes{namespace="a",phase="Running"}'] == 1
    assert s['sandman_reaper_api_requests_total{verb="GET"}'] == 3
    m.refresh({"GET": 5, "DELETE": 1}, None)  # a standby: no inventory
    s = samples(m.registry)
    assert not any(k.startswith("sandman_sandboxes{") for k in s)
    assert s['sandman_reaper_api_requests_total{verb="GET"}'] == 5
    assert any(k.startswith('sandman_build_info{component="reaper"') for k in s)
