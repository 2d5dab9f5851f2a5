"""What a fleet run cost and how fast it was: a JSON-able summary, text tables, files.

A summary is a plain dict (not a dataclass) because it goes straight to JSON
and into side-by-side tables of runs recorded by different versions.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sandman.fleet.records import (
    Attempt,
    Outcome,
    RolloutRecord,
    RunCounters,
    RunData,
    SandboxSpan,
    Source,
)
from sandman.stats import percentile

# A task failure is still a reward signal for the trainer; only infra failures waste a rollout.
VALID_OUTCOMES = (Outcome.OK, Outcome.TASK_FAILED)


def _ms_stats(seconds: Sequence[float], *, mean: bool = False) -> dict[str, Any]:
    ms = [s * 1000 for s in seconds]

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 1)

    out: dict[str, Any] = {
        "n": len(ms),
        "p50": r(percentile(ms, 50)),
        "p99": r(percentile(ms, 99)),
        "max": r(max(ms, default=None)),
    }
    if mean:
        out["mean"] = r(sum(ms) / len(ms)) if ms else None
    return out


def wall_time_s(data: RunData) -> float | None:
    """Run start to the last valid result: trailing infra failures and cleanup are not work done."""
    ends = [
        r.final.t_done
        for r in data.records
        if r.outcome in VALID_OUTCOMES and r.final is not None and r.final.t_done is not None
    ]
    return max(ends, default=None)


def span_end(span: SandboxSpan, t_end: float | None) -> float:
    """A span never released was held until the run ended (or, unknown, for ever)."""
    if span.t_released is not None:
        return span.t_released
    return t_end if t_end is not None else math.inf


def peak_held(spans: Sequence[SandboxSpan], t_end: float | None) -> int:
    # Releases sort before creations at the same instant: a hand-over is not an overlap.
    events = sorted(
        [(s.t_created, 1) for s in spans] + [(span_end(s, t_end), -1) for s in spans],
    )
    peak = held = 0
    for _, delta in events:
        held += delta
        peak = max(peak, held)
    return peak


def _wait_ms(records: Sequence[RolloutRecord]) -> dict[str, dict[str, Any]]:
    waits: dict[str, list[float]] = {"slot": [], "acquire": []}
    for r in records:
        if r.t_slot is not None:
            waits["slot"].append(r.t_slot - r.t_queued)
        a = r.final
        if a is None:
            continue
        if a.t_acquired is not None:
            waits["acquire"].append(a.t_acquired - a.t_requested)
        for key, value in a.phases.items():
            name = key.removesuffix("_s")  # the values become ms; a "_s" name would mislead
            waits.setdefault(name, [])
            if value is not None:
                waits[name].append(value)
    return {name: _ms_stats(vals) for name, vals in waits.items()}


def _failures(records: Sequence[RolloutRecord]) -> list[dict[str, Any]]:
    # Every attempt, not just final ones: retried errors cost time even when the rollout succeeded.
    counts = Counter(
        (a.error_reason, a.retryable) for r in records for a in r.attempts if a.error_reason
    )
    rows = [{"reason": k[0], "retryable": k[1], "count": n} for k, n in counts.items()]
    return sorted(rows, key=lambda row: (-row["count"], row["reason"], str(row["retryable"])))


def summarize(data: RunData) -> dict[str, Any]:
    outcomes = Counter(r.outcome for r in data.records)
    sources = Counter(r.final.source for r in data.records if r.final and r.final.source)
    wall = wall_time_s(data)
    return {
        "strategy": data.strategy,
        "reuse": data.reuse,
        "problems": data.problems,
        "rollouts_per_problem": data.rollouts_per_problem,
        "concurrency": data.concurrency,
        "params": dict(data.params),
        "results_expected": data.problems * data.rollouts_per_problem,
        "results_valid": sum(outcomes[o] for o in VALID_OUTCOMES),
        "results_ok": outcomes[Outcome.OK],
        "task_failures": outcomes[Outcome.TASK_FAILED],
        "infra_failures": outcomes[Outcome.INFRA_FAILED],
        "wall_s": None if wall is None else round(wall, 3),
        "t_end": None if data.t_end is None else round(data.t_end, 3),
        **dataclasses.asdict(data.counters),
        "ttfc_ms": _ms_stats([t for r in data.records if (t := r.ttfc_s) is not None], mean=True),
        # Rollouts whose sandbox was a Ready pool pod: request -> first command's
        # result (the claim, its exec included); on kwok, where tasks run no
        # command, request -> sandbox in hand.
        "warm_claim_ms": _ms_stats(
            [t for r in data.records if r.final and r.final.warm and (t := r.ttfc_s) is not None]
        ),
        "wait_ms": _wait_ms(data.records),
        "failures_by_reason": _failures(data.records),
        "peak_sandboxes_held": peak_held(data.spans, data.t_end),
        "sandboxes": len(data.spans),
        "quarantined": sum(s.quarantined for s in data.spans),
        "sources": {s.value: sources[s] for s in Source},
    }


# -- text --------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)  # summaries round their floats already


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """First column left-aligned (names), the rest right-aligned (numbers)."""
    cells = [list(headers)] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        numbers = [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join([row[0].ljust(widths[0]), *numbers]).rstrip())
    return lines


def run_label(summary: dict[str, Any]) -> str:
    prepull = "+prepull" if (summary.get("params") or {}).get("prepull_ahead") else ""
    return f"{summary['strategy']}{'+reuse' if summary['reuse'] else ''}{prepull}"


def render_text(summary: dict[str, Any]) -> str:
    s = summary
    params = " ".join(f"{k}={v}" for k, v in s["params"].items()) or "-"
    counters = " ".join(f"{f.name}={s.get(f.name)}" for f in dataclasses.fields(RunCounters))
    sources = " ".join(f"{k}={v}" for k, v in s["sources"].items())
    head = [
        (
            "run",
            f"{run_label(s)}  problems={s['problems']} x {s['rollouts_per_problem']}"
            f"  concurrency={s['concurrency']}",
        ),
        ("params", params),
        (
            "results",
            f"{s['results_valid']}/{s['results_expected']} valid"
            f" (ok={s['results_ok']} task_failed={s['task_failures']}"
            f" infra_failed={s['infra_failures']})",
        ),
        ("wall", f"{_fmt(s['wall_s'])} s to last valid result (end {_fmt(s['t_end'])} s)"),
        (
            "sandboxes",
            f"{s['sandboxes']}  peak held={s['peak_sandboxes_held']}"
            f"  quarantined={s['quarantined']}  sources: {sources}",
        ),
        ("counters", counters),
    ]
    lines = [f"{k:<10} {v}" for k, v in head]
    t = s["ttfc_ms"]
    latency = [["ttfc", t["n"], t["p50"], t["p99"], t["max"], t["mean"]]]
    latency += [
        [f"wait {name}", w["n"], w["p50"], w["p99"], w["max"], None]
        for name, w in s["wait_ms"].items()
    ]
    lines += ["", *_table(["latency ms", "n", "p50", "p99", "max", "mean"], latency)]
    if s["failures_by_reason"]:
        rows = [[f["reason"], f["retryable"], f["count"]] for f in s["failures_by_reason"]]
        lines += ["", *_table(["failure", "retryable", "count"], rows)]
    return "\n".join(lines) + "\n"


def compare_text(summaries: Sequence[dict[str, Any]]) -> str:
    headers = ["run", "wall s", "pods", "claims", "resets", "ttfc p50", "ttfc p99", "ttfc max",
               "warm n", "warm p50", "warm p99", "prepulls", "peak held", "infra fail",
               "valid/exp"]  # fmt: skip
    rows = [
        [
            run_label(s),
            s["wall_s"],
            s["pods_created"],
            s["claims"],
            s["resets"],
            s["ttfc_ms"]["p50"],
            s["ttfc_ms"]["p99"],
            s["ttfc_ms"]["max"],
            (s.get("warm_claim_ms") or {}).get("n"),
            (s.get("warm_claim_ms") or {}).get("p50"),
            (s.get("warm_claim_ms") or {}).get("p99"),
            s.get("prepulls"),
            s["peak_sandboxes_held"],
            s["infra_failures"],
            f"{s['results_valid']}/{s['results_expected']}",
        ]
        for s in summaries
    ]
    return "\n".join(_table(headers, rows)) + "\n"


# -- JSON --------------------------------------------------------------------


def _json_dict(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return {k: v.value if isinstance(v, enum.Enum) else v for k, v in pairs}


def run_to_dict(data: RunData) -> dict[str, Any]:
    return dataclasses.asdict(data, dict_factory=_json_dict)


def run_from_dict(d: dict[str, Any]) -> RunData:
    """Inverse of ``run_to_dict``, so a saved run can be re-reported or re-plotted."""

    def attempt(a: dict[str, Any]) -> Attempt:
        return Attempt(**{**a, "source": Source(a["source"]) if a.get("source") else None})

    def record(r: dict[str, Any]) -> RolloutRecord:
        outcome = Outcome(r["outcome"]) if r.get("outcome") else None
        attempts = [attempt(a) for a in r.get("attempts", [])]
        return RolloutRecord(**{**r, "outcome": outcome, "attempts": attempts})

    return RunData(
        **{
            **d,
            "records": [record(r) for r in d.get("records", [])],
            "spans": [
                SandboxSpan(**{**s, "source": Source(s["source"])}) for s in d.get("spans", [])
            ],
            "counters": RunCounters(**d.get("counters", {})),
        }
    )


def write_json(
    path: str | Path,
    summaries: dict[str, Any] | Sequence[dict[str, Any]],
    data: RunData | Sequence[RunData] | None = None,
) -> Path:
    """One summary -> {"summary", "data"?}; a list -> {"runs": [{"summary", "data"?}, ...]}."""
    path = Path(path)
    if isinstance(summaries, dict):
        payload: dict[str, Any] = {"summary": summaries}
        if data is not None:
            if not isinstance(data, RunData):
                raise TypeError("one summary takes one RunData")
            payload["data"] = run_to_dict(data)
    else:
        runs: list[dict[str, Any]] = [{"summary": s} for s in summaries]
        if data is not None:
            datas = [data] if isinstance(data, RunData) else list(data)
            if len(datas) != len(runs):
                raise ValueError(f"{len(runs)} summaries but {len(datas)} runs of data")
            for run, d in zip(runs, datas, strict=True):
                run["data"] = run_to_dict(d)
        payload = {"runs": runs}
    path.parent.mkdir(parents=True, exist_ok=True)
    # allow_nan=False: a NaN/inf would make the file unreadable to strict JSON parsers.
    path.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n")
    return path


def read_json(path: str | Path) -> list[tuple[dict[str, Any], RunData | None]]:
    """(summary, data) per run in a file from ``write_json``; data is None if it wasn't saved."""
    payload = json.loads(Path(path).read_text())
    runs = payload.get("runs", [payload])
    return [(r["summary"], run_from_dict(r["data"]) if "data" in r else None) for r in runs]
