"""Summary arithmetic (Wilson interval, percentiles, holes, flaky tasks) and compare
(McNemar's exact test), each case worked out by hand."""

from __future__ import annotations

from typing import Any

import pytest

from sandman.eval.compare import compare, mcnemar_exact, render_compare
from sandman.eval.summary import percentile, render_text, summarize, wilson


def rec(task: str, status: str, *, repeat: int = 0, reason: str = "r", attempts: int = 1,
        total: float = 1.0, digest: str = "sha256:a") -> dict[str, Any]:  # fmt: skip
    return {
        "task": task, "repeat": repeat, "status": status,
        "score": {"pass": 1, "fail": 0}.get(status), "reason": reason, "attempts": attempts,
        "retried": attempts > 1 and status != "infra_failed", "phases": {"total_s": total},
        "image_digest": digest, "node": "n",
    }  # fmt: skip


def test_wilson_interval() -> None:
    # 5 of 9: p = .5556, z^2 = 3.8415; centre = (p + z^2/18) / (1 + z^2/9)
    # = (.5556 + .2134) / 1.4268 = .5390; half = z sqrt(p(1-p)/9 + z^2/324) / 1.4268
    # = 1.96 * sqrt(.02743 + .01186) / 1.4268 = .2723 -> [.2667, .8113]
    lo, hi = wilson(5, 9)
    assert lo == pytest.approx(0.2667, abs=1e-4) and hi == pytest.approx(0.8113, abs=1e-4)
    # 0 of 10: the interval still has width: [0, z^2/(n + z^2)] = [0, 3.8415/13.8415] = [0, .2775]
    assert wilson(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson(0, 0) == (0.0, 1.0)


def test_percentile_nearest_rank() -> None:
    # ranks: p50 of 4 values = ceil(2) = 2nd; p90 = ceil(3.6) = 4th
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 90) == 4.0


def test_summary_counts_holes_and_never_scores_them() -> None:
    records = [
        rec("a", "pass"), rec("b", "pass", attempts=2), rec("c", "fail", reason="tests_failed"),
        rec("d", "fail", reason="timeout"), rec("e", "infra_failed", reason="ImageNotFound",
                                                attempts=3),
        rec("f", "error", reason="setup_failed"),
    ]  # fmt: skip
    s = summarize(records, max_attempts=3)
    # scored: a, b, c, d -> 2 of 4 = 50%; e and f are holes, not zeros
    assert (s["scored"], s["passed"], s["infra_failed"], s["errors"]) == (4, 2, 1, 1)
    assert s["pass_rate"] == 0.5 and not s["complete"] and s["retried"] == 1
    assert s["failures"] == {
        "fail": {"tests_failed": 1, "timeout": 1},
        "error": {"setup_failed": 1},
        "infra_failed": {"ImageNotFound": 1},
    }
    assert s["line"] == "4 scored, 1 infra-failed after 3 attempts, 1 broken (not scored)"
    text = render_text(s, records)
    assert "pass rate 50.0% over 4 scored tasks" in text and s["line"] in text
    assert "b     0    pass" in text and "(retried)" in text


def test_repeats_average_per_task_and_report_flaky_ones() -> None:
    records = [rec("a", "pass", repeat=r) for r in range(3)] + [
        rec("b", "pass", repeat=0),
        rec("b", "fail", repeat=1),
        rec("b", "pass", repeat=2),
    ]
    s = summarize(records, max_attempts=3)
    # a: 3/3 = 1, b: 2/3 -> rate (1 + 2/3) / 2 = 5/6 over 2 tasks
    assert s["pass_rate"] == pytest.approx(5 / 6, abs=1e-6) and s["scored_tasks"] == 2
    assert s["flaky"] == [{"task": "b", "outcomes": ["pass", "fail", "pass"], "passed": 2}]
    assert s["repeats"] == 3 and "flaky over 3 repeats: b (pass/fail/pass)" in render_text(
        s, records
    )


def test_mcnemar_exact() -> None:
    # no changes: nothing to test
    assert mcnemar_exact(0, 0) == 1.0
    # 0 vs 6 changes: 2 * C(6,0) / 2^6 = 2/64 = .03125 (beyond noise at 5%)
    assert mcnemar_exact(0, 6) == pytest.approx(0.03125)
    # 1 vs 5: 2 * (C(6,0) + C(6,1)) / 64 = 2 * 7 / 64 = .21875
    assert mcnemar_exact(5, 1) == pytest.approx(0.21875)
    # 3 vs 3: 2 * (1 + 6 + 15 + 20) / 64 = 84/64, capped at 1
    assert mcnemar_exact(3, 3) == 1.0


def test_compare_pairs_tasks_and_names_changes() -> None:
    a = [rec(t, "fail") for t in "abcdef"] + [rec("g", "pass"), rec("h", "infra_failed"),
                                              rec("only-a", "pass")]  # fmt: skip
    b = [rec(t, "pass") for t in "abcdef"] + [rec("g", "pass", digest="sha256:b"),
                                              rec("h", "pass"), rec("only-b", "fail")]  # fmt: skip
    c = compare(a, b)
    # paired (scored in both): a..g = 7; changed a..f fail->pass: b = 0, c = 6 -> p = .03125
    assert c["paired"] == 7 and c["fail_to_pass"] == 6 and c["pass_to_fail"] == 0
    assert c["p_value"] == pytest.approx(0.03125) and c["beyond_noise"]
    assert c["not_scored_in_a"] == ["h"] and c["only_in_a"] == ["only-a"]
    assert c["only_in_b"] == ["only-b"] and c["image_changed"] == ["g"]
    text = render_compare(c, "A", "B")
    assert "beyond noise" in text and "a  fail -> pass" in text
    same = compare(a, a)
    assert same["changed"] == [] and same["p_value"] == 1.0 and not same["beyond_noise"]


def on(task: str, dedicated: bool | None, reason: str = "") -> dict[str, Any]:
    """A scored task that ran on a node judged dedicated (True), shared or unknown."""
    r = rec(task, "pass")
    r["conditions"] = {"dedicated_node": dedicated, "placement_reason": reason,
                       "placement": {True: "dedicated", False: "shared"}.get(dedicated)}  # type: ignore[arg-type]  # fmt: skip
    return r


def test_the_summary_says_whether_the_tasks_had_dedicated_nodes() -> None:
    why = "no node is labelled sandman.dev/dedicated=eval (dedicated to profile 'eval')"
    shared = [on("a", False, why), on("b", False, why), rec("c", "infra_failed")]
    s = summarize(shared, max_attempts=1)
    # c never got a node: not counted either way.
    assert s["conditions"] == {"dedicated_nodes": False, "on_dedicated": 0, "on_shared": 2,
                               "unknown": 0, "reason": why}  # fmt: skip
    assert f"dedicated nodes: no: 2 of 2 tasks ran on shared nodes ({why})\n" in render_text(
        s, shared
    )
    # One task on a shared node makes the run not dedicated.
    mixed = summarize([on("a", True), on("b", False)], max_attempts=1)["conditions"]
    assert mixed["dedicated_nodes"] is False and mixed["on_dedicated"] == 1
    dedicated = [on("a", True), on("b", True)]
    s = summarize(dedicated, max_attempts=1)
    assert s["conditions"]["dedicated_nodes"] is True
    assert "dedicated nodes" not in render_text(s, dedicated)
    # Nodes that could not be read; results from before this was recorded.
    unread = summarize([on("a", None, "the nodes cannot be listed")], max_attempts=1)
    assert unread["conditions"]["dedicated_nodes"] is None
    assert "dedicated nodes: unknown for 1 tasks (the nodes cannot be listed)" in render_text(
        unread, [on("a", None, "the nodes cannot be listed")]
    )
    assert summarize([rec("a", "pass")], max_attempts=1)["conditions"]["dedicated_nodes"] is None


def test_compare_flags_runs_whose_nodes_differ() -> None:
    a = [on("t1", True), on("t2", True)]
    b = [on("t1", False), on("t2", False)]
    c = compare(a, b)
    assert c["dedicated_nodes_a"] is True and c["dedicated_nodes_b"] is False
    assert c["conditions_differ"] and c["changed"] == []
    assert "dedicated nodes: A yes, B no: the runs' conditions differ" in render_compare(
        c, "A", "B"
    )
    same = compare(a, a)
    assert not same["conditions_differ"] and "dedicated nodes" not in render_compare(same, "A", "B")
    both_shared = compare(b, b)
    assert not both_shared["conditions_differ"]
    assert "dedicated nodes: A no, B no\n" in render_compare(both_shared, "A", "B")
