"""The scale bench's accounting: which deletions count as wrong, on a recorded stream.

``data/scale_events.jsonl`` is a cut of a real run (`sandman bench scale` on a
local cluster, host components): six held sandboxes whose leases a keeper
extended three or four times each before they ended and the reaper reclaimed
them, seven burst sandboxes created during a chaos run (the reaper leader
killed, the only webhook killed for 33 s, the apiserver restarted), and
two bystanders (no sandbox label, an expires-at of 2020) that survived.
Every test below starts from it and adds the one event that should (or
should not) change the verdict.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from sandman.bench.scale_ledger import (
    Ledger,
    pod_facts,
    read_events,
    reclaim_latencies,
    stuck_reclaims,
    unreclaimed,
    without_daemon,
    wrong_deletions,
)

DATA = Path(__file__).parent / "data" / "scale_events.jsonl"
HELD = [f"held-{i}" for i in (3, 17, 42, 99, 150, 199)]
BURST = [f"burst-{i}" for i in (5, 60, 130, 200, 260, 333, 399)]


@pytest.fixture(scope="module")
def recorded() -> list[dict[str, Any]]:
    return read_events(DATA)


def ledger_of(events: list[dict[str, Any]], *extra: dict[str, Any]) -> Ledger:
    evs = sorted([*copy.deepcopy(events), *extra], key=lambda e: e.get("t", 0.0))
    return Ledger().extend(evs)


def deleting_at(events: list[dict[str, Any]], name: str) -> float:
    return next(e["t"] for e in events if e.get("name") == name and e.get("ev") == "deleting")


def test_the_recorded_run_has_no_wrong_deletion_and_every_lease_reclaimed(
    recorded: list[dict[str, Any]],
) -> None:
    led = ledger_of(recorded)
    assert wrong_deletions(led) == []
    assert without_daemon(led) == []
    end = max(e["t"] for e in recorded)
    assert unreclaimed(led, now=end + 3600, grace_s=30) == []
    kinds = {r.name: r.kind for r in led.pods.values()}
    assert all(kinds[n] == "sandbox" for n in HELD + BURST)
    assert {kinds[f"bystander-{i}"] for i in (1, 2)} == {"bystander"}
    # Held leases were moved (3 or 4 applied extensions each) and all ended
    # before the reaper took the pod: latencies are >= 0 by construction of
    # the check, and the record has one per sandbox.
    assert all(led.pods[n].extensions >= 3 for n in HELD)
    lat = reclaim_latencies(led)
    assert len(lat) == len(HELD + BURST) and min(lat) >= 0
    assert [w.what for w in led.chaos] == ["reaper-leader", "webhook", "apiserver"]


def test_a_deleted_bystander_is_wrong(recorded: list[dict[str, Any]]) -> None:
    t = max(e["t"] for e in recorded) + 1
    led = ledger_of(recorded, {"src": "watch", "ev": "deleting", "t": t, "name": "bystander-1"})
    assert [(w.name, w.why) for w in wrong_deletions(led)] == [("bystander-1", "not-a-sandbox")]


def test_a_deleted_pod_the_bench_never_created_is_wrong(recorded: list[dict[str, Any]]) -> None:
    t = max(e["t"] for e in recorded) + 1
    seen = {"src": "watch", "ev": "seen", "t": t, "name": "stranger", "sandbox": True}
    seen |= {"daemon": True, "missing": [], "expires": t - 100}
    gone = {"src": "watch", "ev": "deleting", "t": t + 1, "name": "stranger"}
    led = ledger_of(recorded, seen, gone)
    # Labeled and long expired, but not one of the bench's leases: nobody
    # was entitled to delete it.
    assert [(w.name, w.why) for w in wrong_deletions(led)] == [("stranger", "not-a-sandbox")]


def test_an_applied_extension_makes_the_later_deletion_early(
    recorded: list[dict[str, Any]],
) -> None:
    gone = deleting_at(recorded, "held-3")
    # The lease was moved to 100 s past the moment the pod's deletion began,
    # and the apiserver applied it to the live pod: deleting at `gone` is
    # 100 s early.
    ext = {"src": "bench", "ev": "extend", "t": gone - 5, "name": "held-3", "ok": True}
    ext |= {"terminating": False, "expires": gone + 100}
    led = ledger_of(recorded, ext)
    wrong = wrong_deletions(led)
    assert [(w.name, w.why) for w in wrong] == [("held-3", "before-lease-end")]
    assert "100.0s before" in wrong[0].detail


@pytest.mark.parametrize(
    ("ok", "terminating"),
    [(True, True), (False, False)],
    ids=["reached-a-terminating-pod", "refused"],
)
def test_an_extension_that_did_not_reach_a_live_pod_does_not_count(
    recorded: list[dict[str, Any]], ok: bool, terminating: bool
) -> None:
    gone = deleting_at(recorded, "held-17")
    ext = {"src": "bench", "ev": "extend", "t": gone + 1, "name": "held-17", "ok": ok}
    ext |= {"terminating": terminating, "expires": gone + 100}
    assert wrong_deletions(ledger_of(recorded, ext)) == []


def test_the_latest_end_the_watch_saw_counts_even_without_the_benchs_answer(
    recorded: list[dict[str, Any]],
) -> None:
    gone = deleting_at(recorded, "held-42")
    # An extension whose answer the bench lost (apiserver restart), seen on
    # the object by the watch before the deletion began.
    seen = {"src": "watch", "ev": "expires", "t": gone - 2, "name": "held-42"}
    seen["expires"] = gone + 30
    assert [w.name for w in wrong_deletions(ledger_of(recorded, seen))] == ["held-42"]


def test_a_deletion_exactly_at_the_lease_end_is_on_time(recorded: list[dict[str, Any]]) -> None:
    gone = deleting_at(recorded, "held-99")
    ext = {"src": "bench", "ev": "extend", "t": gone - 10, "name": "held-99", "ok": True}
    ext |= {"terminating": False, "expires": gone}  # deleting_at == lease_end: 0 s early
    led = ledger_of(recorded, ext)
    assert wrong_deletions(led) == []
    assert led.pods["held-99"].lease_end == gone


def test_the_benchs_own_deletions_never_count(recorded: list[dict[str, Any]]) -> None:
    gone = deleting_at(recorded, "burst-5")
    # The bench deleted burst-5 itself before its lease ended (recorded before
    # the call): early, but ours.
    ext = {"src": "bench", "ev": "extend", "t": gone - 20, "name": "burst-5", "ok": True}
    ext |= {"terminating": False, "expires": gone + 600}
    mine = {"src": "bench", "ev": "delete", "t": gone - 0.5, "name": "burst-5"}
    assert wrong_deletions(ledger_of(recorded, ext, mine)) == []
    # A bench delete that came after someone else had begun deleting it does not excuse it.
    late = dict(mine, t=gone + 1)
    assert [w.name for w in wrong_deletions(ledger_of(recorded, ext, late))] == ["burst-5"]


def test_a_sandbox_without_the_daemon_or_a_default_is_counted(
    recorded: list[dict[str, Any]],
) -> None:
    t = max(e["t"] for e in recorded) + 1
    bare = {"src": "watch", "ev": "seen", "t": t, "name": "let-through", "sandbox": True}
    bare |= {"daemon": False, "missing": ["injected", "admitted"], "expires": None}
    half = dict(bare, name="half", daemon=True, missing=["automountServiceAccountToken"])
    led = ledger_of(recorded, bare, half)
    assert sorted(r.name for r in without_daemon(led)) == ["half", "let-through"]


def test_a_lease_that_ended_without_a_reclaim_is_left_over(
    recorded: list[dict[str, Any]],
) -> None:
    t = max(e["t"] for e in recorded) + 1
    create = {"src": "bench", "ev": "create", "t": t, "t0": t - 1, "name": "held-x"}
    create |= {"kind": "sandbox", "code": 201, "uid": "u-x", "expires": t + 10}
    led = ledger_of(recorded, create)
    # Lease ends at t+10: within the 30 s grace at t+35, left over at t+41.
    assert unreclaimed(led, now=t + 35, grace_s=30) == []
    assert [r.name for r in unreclaimed(led, now=t + 41, grace_s=30)] == ["held-x"]


def never_ready(t: float, name: str, *, gone_after: float, lease: float = 900.0) -> list:
    """A sandbox created at ``t`` that kwok never made Ready, deleted by
    someone else ``gone_after`` seconds after the apiserver created it."""
    uid = f"u-{name}"
    create = {"src": "bench", "ev": "create", "t": t + 0.4, "t0": t - 0.2, "name": name}
    create |= {"kind": "sandbox", "code": 201, "uid": uid, "expires": t + lease}
    seen = {"src": "watch", "ev": "seen", "t": t + 0.5, "name": name, "uid": uid}
    seen |= {"sandbox": True, "daemon": True, "missing": [], "expires": t + lease, "created": t}
    bound = {"src": "watch", "ev": "bound", "t": t + 3, "name": name, "uid": uid, "node": "n-1"}
    gone = {"src": "watch", "ev": "deleting", "t": t + gone_after, "name": name, "uid": uid}
    return [create, seen, bound, gone]


def test_the_reapers_stuck_rule_is_reported_apart_not_as_wrong(
    recorded: list[dict[str, Any]],
) -> None:
    t = max(e["t"] for e in recorded) + 1
    led = ledger_of(recorded, *never_ready(t, "held-900", gone_after=601))
    assert wrong_deletions(led) == []
    assert [r.name for r in stuck_reclaims(led)] == ["held-900"]
    # Its early deletion is not a reclaim latency (it would be -299 s).
    assert all(x >= 0 for x in reclaim_latencies(led))


@pytest.mark.parametrize(
    "change",
    ["too-soon", "was-ready", "bystander"],
)
def test_an_early_deletion_outside_the_stuck_rule_stays_wrong(
    recorded: list[dict[str, Any]], change: str
) -> None:
    t = max(e["t"] for e in recorded) + 1
    events = never_ready(t, "held-901", gone_after=599 if change == "too-soon" else 700)
    if change == "was-ready":
        events.append({"src": "watch", "ev": "ready", "t": t + 20, "name": "held-901"})
    if change == "bystander":
        events[0]["kind"] = "bystander"
    led = ledger_of(recorded, *events)
    assert [w.name for w in wrong_deletions(led)] == ["held-901"]
    assert stuck_reclaims(led) == []


def pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "uid": "u",
            "creationTimestamp": "2026-12-01T09:50:00Z",
            "labels": {"sandman.dev/sandbox": "true", "sandman.dev/id": "abc"},
            "annotations": {
                "sandman.dev/injected": "0.1.0",
                "sandman.dev/admitted": "x",
                "sandman.dev/expires-at": "2026-12-01T10:00:00Z",
            },
        },
        "spec": {
            "activeDeadlineSeconds": 86400,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "schedulerName": "sandman-scheduler",
            "initContainers": [{"name": "sandman-install"}],
            "containers": [{"name": "main", "command": ["/.sandman/rt/bin/sandmand", "-I"]}],
            **spec,
        },
    }


def test_pod_facts_reads_the_injection_and_the_defaults() -> None:
    facts = pod_facts(pod())
    assert facts["daemon"] and facts["missing"] == [] and facts["sandbox"]
    assert facts["expires"] == 1796119200.0  # 2026-12-01T10:00:00Z
    assert facts["created"] == 1796118600.0  # 2026-12-01T09:50:00Z
    let_through = pod(initContainers=[], containers=[{"name": "main", "command": ["sleep"]}])
    assert not pod_facts(let_through)["daemon"]
    lax = pod(automountServiceAccountToken=None, schedulerName="default-scheduler")
    assert pod_facts(lax)["missing"] == ["automountServiceAccountToken", "schedulerName"]
    # The node delivery: no install step, the node's tree mounted where the daemon runs from.
    node_tree = {"name": "sandman-daemon-shared", "mountPath": "/.sandman/rt", "readOnly": True}
    main = {"name": "main", "command": ["/.sandman/rt/bin/sandmand"], "volumeMounts": [node_tree]}
    assert pod_facts(pod(initContainers=[], containers=[main]))["daemon"]
    main["volumeMounts"] = [dict(node_tree, mountPath="/elsewhere")]
    assert not pod_facts(pod(initContainers=[], containers=[main]))["daemon"]


def test_a_sandbox_reclaimed_before_it_was_ready_is_settled_and_counted(
    recorded: list[dict[str, Any]],
) -> None:
    from sandman.bench.scale import settled
    from sandman.bench.scale_report import pod_figures

    name = BURST[0]
    # Drop its Ready: its lease ended while the scheduler was still behind.
    events = [e for e in recorded if not (e.get("name") == name and e.get("ev") == "ready")]
    led = ledger_of(events)
    rec = led.pods[name]
    assert rec.ready_at is None and rec.deleting_at is not None
    assert settled(rec)  # the bench does not wait for a Ready that will never come
    figs = pod_figures(led, lambda r: r.name.startswith("burst-"))
    assert figs["deleted_before_ready"] == 1
    assert figs["ready"] == len(BURST) - 1
    assert figs["all_ready_s"] != figs["all_ready_s"]  # NaN: not all were Ready
    # A created pod neither Ready nor deleting is still awaited.
    events = [e for e in events if not (e.get("name") == name and e.get("ev") == "deleting")]
    assert not settled(ledger_of(events).pods[name])


def test_webhook_rejections_are_split_into_denials_and_failed_calls() -> None:
    from sandman.bench.scale_metrics import parse_prometheus
    from sandman.bench.scale_report import admission_figures

    text = "\n".join(
        [
            'apiserver_admission_webhook_rejection_count{error_type="no_error",'
            'name="claims.sandman.dev",operation="DELETE",rejection_code="403",'
            'type="validating"} 4',
            'apiserver_admission_webhook_rejection_count{error_type="calling_webhook_error",'
            'name="inject.sandman.dev",operation="CREATE",rejection_code="0",type="admit"} 57',
            'apiserver_admission_webhook_rejection_count{error_type="no_error",'
            'name="policy.sandman.dev",operation="CREATE",rejection_code="403",'
            'type="validating"} 0',
        ]
    )
    figs = admission_figures(parse_prometheus(text), {})
    assert figs["webhook_rejections"] == 61
    assert figs["webhook_denials"] == {"claims.sandman.dev": 4}
    assert figs["webhook_call_errors"] == 57


def test_scheduler_figures_report_the_mean_where_the_buckets_end() -> None:
    from sandman.bench.scale_metrics import parse_prometheus
    from sandman.bench.scale_report import scheduler_figures

    bind = "scheduler_framework_extension_point_duration_seconds"
    lbl = 'extension_point="Bind",profile="sandman-scheduler",status="Success"'
    text = "\n".join(
        [
            f'{bind}_bucket{{{lbl},le="0.1024"}} 0',
            f'{bind}_bucket{{{lbl},le="0.2048"}} 0',
            f'{bind}_bucket{{{lbl},le="+Inf"}} 10',
            f"{bind}_sum{{{lbl}}} 12.0",
            f"{bind}_count{{{lbl}}} 10",
            'sandman_extender_request_duration_seconds_bucket{verb="prioritize",le="0.001"} 9',
            'sandman_extender_request_duration_seconds_bucket{verb="prioritize",le="0.01"} 10',
            'sandman_extender_request_duration_seconds_bucket{verb="prioritize",le="+Inf"} 10',
            'sandman_extender_request_duration_seconds_sum{verb="prioritize"} 0.011',
            'sandman_extender_request_duration_seconds_count{verb="prioritize"} 10',
            'scheduler_schedule_attempts_total{profile="sandman-scheduler",result="scheduled"} 10',
        ]
    )
    s = parse_prometheus(text)
    figs = scheduler_figures(s, s)
    # Every Bind took longer than the last finite bucket: the quantile is that
    # bound, the mean says 1.2 s.
    assert figs["scheduler_bind_p50_ms"] == pytest.approx(204.8)
    assert figs["scheduler_bind_mean_ms"] == pytest.approx(1200.0)
    assert figs["extender_prioritize_p50_ms"] < 1.0
    assert figs["extender_calls"] == 10
    assert figs["scheduled_attempts"] == {"scheduled": 10}


def test_what_happened_during_a_fault_is_counted_from_the_record(
    recorded: list[dict[str, Any]],
) -> None:
    from sandman.bench.scale_report import during

    led = ledger_of(recorded)
    webhook = next(w for w in led.chaos if w.what == "webhook")
    got = during(led, webhook.start, webhook.end)
    pods = list(led.sandboxes())
    assert got["bound"] == sum(
        1 for r in pods if r.bound_at and webhook.start <= r.bound_at <= webhook.end
    )
    # Everything, over the whole record.
    everything = during(led, 0.0, float("inf"))
    assert everything["created"] == sum(1 for r in pods if r.created_at)
    assert everything["deleting"] == sum(1 for r in pods if r.deleting_at)
    assert during(led, 0.0, 1.0) == dict.fromkeys(everything, 0)
