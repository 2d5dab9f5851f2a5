"""The live progress of a fleet run: counts by state, TTFC so far, and the terminal bar."""

from __future__ import annotations

import io

from sandman.fleet.progress import ProgressLine, render, snapshot
from sandman.fleet.records import Attempt, Outcome, RolloutRecord, Source


def rec(outcome: Outcome | None, slot: bool, ttfc: float | None = None) -> RolloutRecord:
    r = RolloutRecord("p", 0, outcome=outcome, t_slot=1.0 if slot else None)
    if slot:
        r.attempts.append(Attempt(Source.CREATED, "sb", t_requested=1.0,
                                  t_acquired=None if ttfc is None else 1.0 + ttfc))  # fmt: skip
    return r


def test_snapshot_counts_each_rollout_once() -> None:
    records = [
        rec(Outcome.OK, True, ttfc=1.0),
        rec(Outcome.TASK_FAILED, True, ttfc=3.0),  # a valid result too: the agent's failure
        rec(Outcome.INFRA_FAILED, True),
        rec(None, True),  # has a slot, no result yet
        rec(None, False),  # still queued
    ]
    p = snapshot(records, total=8, elapsed_s=12.0)
    # 2 done + 1 failed + 1 running; the other 4 of 8 wait (3 not even dispatched yet).
    assert (p.done, p.failed, p.running, p.waiting, p.finished) == (2, 1, 1, 4, 3)
    assert (p.ttfc_p50_s, p.ttfc_max_s) == (1.0, 3.0)  # nearest rank: ceil(0.5 * 2) = 1st


def test_render_shows_the_bar_and_every_count() -> None:
    p = snapshot([rec(Outcome.OK, True, ttfc=1.25), rec(None, True)], total=4, elapsed_s=3.4)
    line = render(p, width=8)
    # 1 of 4 finished: 8 * 1 // 4 = 2 filled cells, then the head, then 5 dots.
    assert line.startswith("[##>.....] 1/4  done 1  running 1  waiting 2  failed 0")
    assert "ttfc p50 1.2s max 1.2s" in line and line.endswith("3s")
    assert render(snapshot([], 0, 0.0), width=4).startswith("[####] 0/0")


def test_progress_line_repaints_in_place_at_most_every_interval() -> None:
    now = [0.0]
    out = io.StringIO()
    bar = ProgressLine(out, interval_s=0.5, clock=lambda: now[0], force=True)
    p = snapshot([], 2, 0.0)
    bar.update(p)
    now[0] = 0.2
    bar.update(p)  # too soon: skipped
    now[0] = 0.6
    bar.update(p)
    bar.done(p)  # always painted, then a newline
    assert out.getvalue().count("\r") == 3 and out.getvalue().endswith("\x1b[K\n")


def test_progress_line_is_silent_off_a_terminal() -> None:
    out = io.StringIO()  # isatty() is False
    bar = ProgressLine(out)
    bar.update(snapshot([], 1, 0.0))
    bar.done(snapshot([], 1, 0.0))
    assert out.getvalue() == ""
