"""Where a running fleet is: counts by state, TTFC so far, and a one-line bar.

``snapshot`` and ``render`` are pure (records in, text out); ``ProgressLine``
writes the bar to a terminal, repainting in place, at most every
``interval_s`` (clock injected), and writes nothing when the stream is not a
terminal (a log file gets the final report instead of a thousand repaints).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from sandman.fleet.records import Outcome, RolloutRecord
from sandman.stats import percentile

# Repaints per second a person can follow; more only burns a terminal's CPU.
REPAINT_S = 0.2


@dataclass(frozen=True)
class Progress:
    total: int
    done: int  # a valid result: ok or task_failed (a reward the trainer can use)
    failed: int  # infrastructure failures after every retry (no result)
    running: int  # has a concurrency slot: acquiring a sandbox or running the task
    waiting: int  # queued for a slot
    ttfc_p50_s: float | None  # over the results so far
    ttfc_max_s: float | None
    elapsed_s: float

    @property
    def finished(self) -> int:
        return self.done + self.failed


def snapshot(records: Sequence[RolloutRecord], total: int, elapsed_s: float) -> Progress:
    done = failed = running = 0
    ttfc = []
    for r in records:
        if r.outcome is Outcome.INFRA_FAILED:
            failed += 1
        elif r.outcome is not None:
            done += 1
            if (t := r.ttfc_s) is not None:
                ttfc.append(t)
        elif r.t_slot is not None:
            running += 1
    waiting = total - done - failed - running
    return Progress(total, done, failed, running, waiting, percentile(ttfc, 50),
                    max(ttfc, default=None), elapsed_s)  # fmt: skip


def render(p: Progress, width: int = 24) -> str:
    """One line: ``[######>......] 12/40  done 11  running 8  waiting 20  failed 1  ttfc ...``."""
    filled = width * p.finished // p.total if p.total else width
    bar = "#" * filled + (">" if filled < width else "") + "." * max(0, width - filled - 1)
    ttfc = "-" if p.ttfc_p50_s is None else f"{p.ttfc_p50_s:.1f}s"
    ttfc_max = "" if p.ttfc_max_s is None else f" max {p.ttfc_max_s:.1f}s"
    return (
        f"[{bar}] {p.finished}/{p.total}  done {p.done}  running {p.running}  "
        f"waiting {p.waiting}  failed {p.failed}  ttfc p50 {ttfc}{ttfc_max}  {p.elapsed_s:.0f}s"
    )


class ProgressLine:
    """A bar repainted in place on a terminal (``\\r`` + clear to end of line).

    Prevents a flood of lines in logs and CI output: on a stream that is not a
    terminal, ``update`` writes nothing. Not thread-safe (one writer).
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        interval_s: float = REPAINT_S,
        clock: Callable[[], float] = time.monotonic,
        force: bool = False,
    ) -> None:
        self.stream, self.interval_s, self.clock = stream, interval_s, clock
        self.enabled = force or stream.isatty()
        self._last = -float("inf")
        self._shown = False

    def update(self, p: Progress, *, now: bool = False) -> None:
        if not self.enabled or (not now and self.clock() - self._last < self.interval_s):
            return
        self._last = self.clock()
        self.stream.write("\r" + render(p) + "\x1b[K")
        self.stream.flush()
        self._shown = True

    def done(self, p: Progress) -> None:
        """The final state, then a newline so later output starts on its own line."""
        self.update(p, now=True)
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()
