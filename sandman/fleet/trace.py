"""A fleet run as a Chrome trace (JSON Trace Event Format), for Perfetto or chrome://tracing.

One process per run, one track (thread) per sandbox, ordered by creation;
each sandbox's phases (warming, idle in a pool, busy) are slices on its
track, with the rollouts it served nested inside ``busy``. A counter track
shows how many sandboxes the run held over time, and infrastructure
failures that never got a sandbox are instants on a ``failures`` track.

Scale: a sandbox costs about eight events, ~0.75 kB of compact JSON (a run of
10,000 sandboxes with one rollout each measured 7.6 MB, written in 1.7 s),
which ui.perfetto.dev opens in seconds; the PNG timeline samples rows, the
trace keeps them all.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sandman.fleet.plot import segments, time_extent
from sandman.fleet.records import RunData, SandboxSpan
from sandman.fleet.report import run_label, span_end, summarize

US = 1_000_000  # trace timestamps are microseconds
PHASE_NAMES = {"warming": "warming", "idle": "idle in pool", "busy": "busy"}
FAILURES_TID = 0  # the failures track sorts above every sandbox


def _us(t: float) -> int:
    return round(t * US)


def _slice(pid: int, tid: int, name: str, t0: float, t1: float, **args: Any) -> dict[str, Any]:
    ev = {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": _us(t0), "dur": _us(t1 - t0)}
    if args:
        ev["args"] = args
    return ev


def _meta(pid: int, tid: int | None, name: str, value: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "M", "pid": pid, "name": name, "args": {}}
    if tid is not None:
        ev["tid"] = tid
    ev["args"] = {"name": value} if name.endswith("_name") else {"sort_index": value}
    return ev


def _span_events(pid: int, tid: int, span: SandboxSpan, end: float) -> Iterator[dict[str, Any]]:
    for t0, t1, phase in segments(span, end):
        if t1 > t0:
            args: dict[str, Any] = {"problem": span.problem, "source": span.source.value}
            if phase == "busy":
                args["rollouts"] = span.rollouts
                args["quarantined"] = span.quarantined
            yield _slice(pid, tid, PHASE_NAMES[phase], t0, t1, **args)


def _busy_window(span: SandboxSpan, end: float) -> tuple[float, float] | None:
    for t0, t1, phase in segments(span, end):
        if phase == "busy":
            return t0, t1
    return None


def run_events(data: RunData, pid: int) -> list[dict[str, Any]]:
    """Trace events of one run (``pid`` is its process in the trace)."""
    spans = sorted(data.spans, key=lambda s: (s.t_created, s.name))
    tids = {s.name: i + 1 for i, s in enumerate(spans)}
    t_end = data.t_end if data.t_end is not None else time_extent([data])
    s = summarize(data)
    events = [
        _meta(pid, None, "process_name", f"{run_label(s)} ({len(spans)} sandboxes)"),
        _meta(pid, None, "process_sort_index", pid),
        _meta(pid, FAILURES_TID, "thread_name", "failures"),
        _meta(pid, FAILURES_TID, "thread_sort_index", FAILURES_TID),
    ]
    ends = {}
    for span in spans:
        tid = tids[span.name]
        ends[span.name] = end = span_end(span, t_end)
        events.append(_meta(pid, tid, "thread_name", f"{span.name} ({span.problem})"))
        events.append(_meta(pid, tid, "thread_sort_index", tid))
        events.extend(_span_events(pid, tid, span, end))
    by_name = {sp.name: sp for sp in spans}
    for rec in data.records:
        for n, a in enumerate(rec.attempts):
            done = a.t_done if a.t_done is not None else t_end
            args = {"problem": rec.problem, "rollout": rec.rollout, "attempt": n + 1}
            if a.sandbox is None or a.sandbox not in by_name:
                if a.error_reason:  # never got a sandbox: an instant on the failures track
                    events.append({"ph": "i", "s": "t", "pid": pid, "tid": FAILURES_TID,
                                   "name": a.error_reason, "ts": _us(done),
                                   "args": {**args, "retryable": a.retryable}})  # fmt: skip
                continue
            window = _busy_window(by_name[a.sandbox], ends[a.sandbox])
            start = a.t_acquired if a.t_acquired is not None else a.t_requested
            if window is None:
                continue
            # Clamped into the sandbox's busy slice, so the nesting is exact for the viewer.
            t0, t1 = max(start, window[0]), min(done, window[1])
            if t1 < t0:
                continue
            final = n == len(rec.attempts) - 1
            if final and rec.outcome is not None:
                args["outcome"] = rec.outcome.value
                args["reward"] = rec.reward
                args["ttfc_s"] = rec.ttfc_s
            if a.error_reason:
                args["error"] = a.error_reason
            name = f"{rec.problem}#{rec.rollout}"
            events.append(_slice(pid, tids[a.sandbox], name, t0, t1, **args))
    events.extend(_held_counter(pid, spans, t_end))
    return events


def _held_counter(pid: int, spans: Sequence[SandboxSpan], t_end: float) -> list[dict[str, Any]]:
    # Releases sort before creations at the same instant, as in report.peak_held.
    changes = sorted([(s.t_created, 1) for s in spans] + [(span_end(s, t_end), -1) for s in spans])
    held, out = 0, []
    for t, delta in changes:
        held += delta
        out.append({"ph": "C", "pid": pid, "name": "sandboxes held", "ts": _us(t),
                    "args": {"held": held}})  # fmt: skip
    return out


def chrome_trace(data: RunData | Sequence[RunData]) -> dict[str, Any]:
    runs = [data] if isinstance(data, RunData) else list(data)
    events: list[dict[str, Any]] = []
    for i, run in enumerate(runs):
        events.extend(run_events(run, pid=i + 1))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(data: RunData | Sequence[RunData], path: str | Path) -> Path:
    """Write the runs' trace as compact JSON (open it at ui.perfetto.dev)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(data), separators=(",", ":"), allow_nan=False))
    return path
