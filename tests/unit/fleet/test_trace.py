"""The Chrome-trace export of a run: tracks, nested slices, counters, and its size at scale."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from sandman.fleet.records import Attempt, Outcome, RolloutRecord, RunData, SandboxSpan, Source
from sandman.fleet.trace import US, chrome_trace, write_trace


def small_run() -> RunData:
    spans = [
        # A pool pod: warming 0->1, idle 1->2, busy 2->6; served two rollouts (reused once).
        SandboxSpan("pod-a", "p0", Source.CLAIMED, t_created=0.0, t_ready=1.0, t_claimed=2.0,
                    t_released=6.0, rollouts=2),
        # Created on demand: warming 0.5->3, busy 3->5, quarantined after its rollout.
        SandboxSpan("pod-b", "p1", Source.CREATED, t_created=0.5, t_ready=3.0, t_released=5.0,
                    rollouts=1, quarantined=True),
    ]  # fmt: skip
    records = [
        RolloutRecord("p0", 0, Outcome.OK, 1.0,
                      [Attempt(Source.CLAIMED, "pod-a", 1.9, t_acquired=2.0, t_first_result=2.5,
                               t_done=3.5)]),
        RolloutRecord("p0", 1, Outcome.OK, 0.0,
                      [Attempt(Source.REUSED, "pod-a", 3.6, t_acquired=3.8, t_done=6.5)]),
        RolloutRecord("p1", 0, Outcome.TASK_FAILED, None,
                      [Attempt(None, None, 0.2, t_done=0.4, error_reason="Unreachable",
                               retryable=True),
                       Attempt(Source.CREATED, "pod-b", 0.5, t_acquired=3.0, t_done=4.0)]),
    ]  # fmt: skip
    return RunData("pipelined", True, 2, 2, 4, records=records, spans=spans, t_end=7.0)


def by_phase(events: list[dict], ph: str) -> list[dict]:
    return [e for e in events if e["ph"] == ph]


def test_one_track_per_sandbox_with_its_phases_as_slices() -> None:
    events = chrome_trace(small_run())["traceEvents"]
    names = {
        e["tid"]: e["args"]["name"] for e in by_phase(events, "M") if e["name"] == "thread_name"
    }
    assert names == {0: "failures", 1: "pod-a (p0)", 2: "pod-b (p1)"}  # ordered by creation
    slices = [(e["tid"], e["name"], e["ts"], e["dur"]) for e in by_phase(events, "X")]
    assert (1, "warming", 0, 1 * US) in slices
    assert (1, "idle in pool", 1 * US, 1 * US) in slices
    assert (1, "busy", 2 * US, 4 * US) in slices
    assert (2, "warming", round(0.5 * US), round(2.5 * US)) in slices
    assert (2, "busy", 3 * US, 2 * US) in slices


def test_rollouts_nest_inside_busy_and_failures_get_their_own_track() -> None:
    events = chrome_trace(small_run())["traceEvents"]
    rollouts = {e["name"]: e for e in by_phase(events, "X") if "#" in e["name"]}
    assert set(rollouts) == {"p0#0", "p0#1", "p1#0"}
    # p0#1 ran 3.8 -> 6.5 but pod-a's busy slice ends at 6.0: clamped to 3.8 -> 6.0.
    assert (rollouts["p0#1"]["ts"], rollouts["p0#1"]["dur"]) == (round(3.8 * US), round(2.2 * US))
    assert abs(rollouts["p0#0"]["args"]["ttfc_s"] - 0.6) < 1e-9  # requested 1.9 -> first result 2.5
    assert rollouts["p1#0"]["args"]["outcome"] == "task_failed"
    (failure,) = by_phase(events, "i")
    assert (failure["tid"], failure["name"], failure["args"]["retryable"]) == (
        0, "Unreachable", True)  # fmt: skip


def test_held_counter_steps_with_creations_and_releases() -> None:
    counter = [
        (e["ts"], e["args"]["held"])
        for e in by_phase(chrome_trace(small_run())["traceEvents"], "C")
    ]
    # +a at 0, +b at 0.5, -b at 5, -a at 6
    assert counter == [(0, 1), (round(0.5 * US), 2), (5 * US, 1), (6 * US, 0)]


def test_runs_are_processes_and_thousands_of_sandboxes_stay_small(tmp_path: Path) -> None:
    n = 5000
    spans = [
        SandboxSpan(f"sb-{i}", f"p{i % 50}", Source.CREATED, t_created=i * 0.01,
                    t_ready=i * 0.01 + 2.0, t_released=i * 0.01 + 30.0, rollouts=1)
        for i in range(n)
    ]  # fmt: skip
    records = [
        RolloutRecord(f"p{i % 50}", i // 50, Outcome.OK, 1.0,
                      [Attempt(Source.CREATED, f"sb-{i}", i * 0.01, t_acquired=i * 0.01 + 2.0,
                               t_done=i * 0.01 + 29.0)])
        for i in range(n)
    ]  # fmt: skip
    big = RunData("none", False, 50, 100, 256, records=records, spans=spans, t_end=90.0)
    path = write_trace([big, small_run()], tmp_path / "trace.json")
    doc = json.loads(path.read_text())
    pids = Counter(e["pid"] for e in doc["traceEvents"])
    assert set(pids) == {1, 2}
    tracks = {e["tid"] for e in doc["traceEvents"] if e["pid"] == 1 and e["ph"] == "X"}
    assert len(tracks) == n  # every sandbox kept, none sampled
    # ~8 events per sandbox (2 metadata, 2 phases, 1 rollout, 2 counter steps): a few hundred
    # bytes each, so 5,000 sandboxes stay well under 10 MB.
    assert path.stat().st_size < 10_000_000
