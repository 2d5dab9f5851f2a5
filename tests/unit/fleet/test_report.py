from __future__ import annotations

import json
from pathlib import Path

from sandman.fleet.records import (
    Attempt,
    Outcome,
    RolloutRecord,
    RunCounters,
    RunData,
    SandboxSpan,
    Source,
)
from sandman.fleet.report import (
    compare_text,
    peak_held,
    percentile,
    read_json,
    render_text,
    run_from_dict,
    run_to_dict,
    summarize,
    write_json,
)


def ok(problem: str, rollout: int, t_req: float, t_acq: float, t_first: float, t_done: float,
       source: Source = Source.CREATED, **kw: object) -> RolloutRecord:  # fmt: skip
    attempt = Attempt(source=source, sandbox=f"sb-{problem}-{rollout}", t_requested=t_req,
                      t_acquired=t_acq, t_first_result=t_first, t_done=t_done,
                      phases={"create_s": 0.1, "ready_s": 0.4})  # fmt: skip
    return RolloutRecord(problem, rollout, Outcome.OK, 1.0, [attempt], t_queued=0.0,
                         t_slot=t_req, **kw)  # fmt: skip


def sample_run() -> RunData:
    retried = ok("p1", 1, 1.0, 2.0, 2.5, 6.0)
    retried.attempts.insert(
        0, Attempt(Source.CREATED, "sb-bad", 0.5, error_reason="Unreachable", retryable=True)
    )
    task_failed = ok("p2", 0, 0.0, 1.0, 1.2, 8.0, source=Source.CLAIMED)
    task_failed.outcome = Outcome.TASK_FAILED
    infra = RolloutRecord(
        "p2", 1, Outcome.INFRA_FAILED,
        attempts=[
            Attempt(Source.CREATED, None, 1.0, t_done=3.0, error_reason="Unreachable",
                    retryable=True),
            Attempt(Source.CREATED, None, 3.0, t_done=20.0, error_reason="ImageNotFound",
                    retryable=False),
        ],
    )  # fmt: skip
    return RunData(
        strategy="pool",
        reuse=True,
        problems=2,
        rollouts_per_problem=2,
        concurrency=4,
        params={"window": 4},
        records=[ok("p1", 0, 0.0, 0.5, 0.6, 5.0), retried, task_failed, infra],
        spans=[
            SandboxSpan("a", "p1", Source.CREATED, 0.0, 0.5, t_released=5.0),
            SandboxSpan("b", "p1", Source.CREATED, 1.0, 2.0, t_released=6.0),
            SandboxSpan("c", "p2", Source.CLAIMED, 0.0, 0.3, t_claimed=1.0, quarantined=True),
        ],
        counters=RunCounters(pods_created=3, claims=1, resets=2, infra_retries=2),
        t_end=21.0,
    )


def test_percentile_nearest_rank_and_empty() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0
    assert percentile([3, 1, 2], 50) == 2
    assert percentile([], 50) is None


def test_summary_counts_and_wall_stops_at_last_valid_result() -> None:
    s = summarize(sample_run())
    assert s["results_expected"] == 4
    assert s["results_valid"] == 3  # ok + task_failed
    assert s["results_ok"] == 2
    assert (s["task_failures"], s["infra_failures"]) == (1, 1)
    # The infra-failed record finishes at t=20 but must not count as work done.
    assert s["wall_s"] == 8.0
    assert s["t_end"] == 21.0
    assert (s["pods_created"], s["claims"], s["resets"], s["infra_retries"]) == (3, 1, 2, 2)
    assert s["sandboxes"] == 3
    assert s["quarantined"] == 1
    assert s["sources"] == {"created": 3, "claimed": 1, "reused": 0}
    json.dumps(s, allow_nan=False)


def test_latencies_in_ms() -> None:
    s = summarize(sample_run())
    # ttfc of the three valid records: 0.6, 1.5, 1.2 s; the infra failure has none.
    assert s["ttfc_ms"] == {"n": 3, "p50": 1200.0, "p99": 1500.0, "max": 1500.0, "mean": 1100.0}
    waits = s["wait_ms"]
    assert list(waits)[:2] == ["slot", "acquire"]
    assert waits["slot"]["max"] == 1000.0
    assert waits["acquire"]["n"] == 3  # the infra failure's final attempt never acquired
    assert waits["create"]["p50"] == 100.0
    assert waits["ready"]["max"] == 400.0


def test_failures_by_reason_counts_retried_attempts() -> None:
    s = summarize(sample_run())
    assert s["failures_by_reason"] == [
        {"reason": "Unreachable", "retryable": True, "count": 2},
        {"reason": "ImageNotFound", "retryable": False, "count": 1},
    ]


def test_peak_held_counts_overlaps_not_handovers() -> None:
    spans = [
        SandboxSpan("a", "p", Source.CREATED, 0.0, t_released=2.0),
        SandboxSpan("b", "p", Source.CREATED, 2.0, t_released=4.0),  # starts as a ends
        SandboxSpan("c", "p", Source.CREATED, 1.0, t_released=3.0),
        SandboxSpan("d", "p", Source.CLAIMED, 3.5),  # never released: held until t_end
    ]
    assert peak_held(spans, t_end=10.0) == 2
    assert peak_held([*spans, SandboxSpan("e", "p", Source.CREATED, 3.6)], t_end=None) == 3
    assert peak_held([], t_end=None) == 0
    assert summarize(sample_run())["peak_sandboxes_held"] == 3


def test_empty_run_summary() -> None:
    s = summarize(RunData("on-demand", False, 0, 0, 1))
    assert s["wall_s"] is None
    assert s["ttfc_ms"] == {"n": 0, "p50": None, "p99": None, "max": None, "mean": None}
    assert s["failures_by_reason"] == []
    assert "on-demand" in render_text(s)
    assert "on-demand" in compare_text([s])


def test_render_text_contains_numbers() -> None:
    text = render_text(summarize(sample_run()))
    assert "pool+reuse" in text
    assert "3/4 valid" in text
    assert "8.0 s" in text
    assert "peak held=3" in text
    assert "1200.0" in text and "1500.0" in text
    assert "Unreachable" in text and "ImageNotFound" in text
    assert "window=4" in text


def test_compare_text_one_aligned_row_per_run() -> None:
    a = summarize(sample_run())
    b = {**a, "strategy": "on-demand", "reuse": False, "wall_s": 12.5}
    lines = compare_text([a, b]).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("run")
    assert lines[1].startswith("pool+reuse") and lines[2].startswith("on-demand ")
    assert "12.5" in lines[2] and "3/4" in lines[1]
    assert len({len(line) for line in lines}) == 1  # right-aligned columns end together


def test_json_round_trip(tmp_path: Path) -> None:
    run = sample_run()
    raw = run_to_dict(run)
    assert raw["records"][0]["outcome"] == "ok"
    assert raw["spans"][2]["source"] == "claimed"
    assert run_from_dict(json.loads(json.dumps(raw))) == run

    summary = summarize(run)
    one = write_json(tmp_path / "one.json", summary, run)
    assert json.loads(one.read_text())["summary"]["wall_s"] == 8.0
    [(s, d)] = read_json(one)
    assert s == summary and d == run

    many = write_json(tmp_path / "out" / "many.json", [summary, summary])
    runs = read_json(many)
    assert [d for _, d in runs] == [None, None]
