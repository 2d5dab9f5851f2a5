"""The summary of a run: counts, pass rate with a confidence interval, phase
timings, failures by reason, flaky tasks (pure: result records in, a dict and
a table out).

The pass rate is over scored tasks only: an infrastructure failure or a
broken task is a hole in the result, reported as such ("N scored, M
infra-failed after K attempts"), never a zero. With repeats, a task's score
is the mean of its scored repeats and the rate is the mean over tasks; the
Wilson interval then uses the number of tasks (a conservative width: averaged
repeats vary less than one Bernoulli draw).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sandman.eval.decide import ERROR, FAIL, INFRA, PASS, SCORED

# Two-sided 95%: the normal quantile 1.959964 (Wilson, 1927; the interval
# that keeps its coverage near 95% even for small n and rates near 0 or 1,
# where the textbook p +- 1.96 sqrt(p(1-p)/n) collapses to zero width).
Z95 = 1.959963984540054
PHASES = ("start_s", "pod_create_s", "schedule_s", "pull_start_s", "ready_s", "check_s",
          "setup_s", "apply_s", "test_s", "release_s", "total_s")  # fmt: skip


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a rate ``successes / n`` (0, 1 when n is 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _phase_stats(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    values: dict[str, list[float]] = defaultdict(list)
    for r in records:
        for k, v in (r.get("phases") or {}).items():
            values[k].append(float(v))
    order = [p for p in PHASES if p in values] + sorted(set(values) - set(PHASES))
    return {
        k: {
            "n": len(values[k]),
            "p50": round(percentile(values[k], 50), 3),
            "p90": round(percentile(values[k], 90), 3),
            "max": round(max(values[k]), 3),
        }
        for k in order
    }


def flaky_tasks(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tasks whose scored repeats disagree (a benchmark's measured flakiness)."""
    by_task: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for r in records:
        if r["status"] in SCORED:
            by_task[r["task"]].append((int(r.get("repeat", 0)), r["status"]))
    out = []
    for task, seen in sorted(by_task.items()):
        outcomes = [s for _, s in sorted(seen)]
        if len(set(outcomes)) > 1:
            out.append({"task": task, "outcomes": outcomes, "passed": outcomes.count(PASS)})
    return out


def task_scores(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Each task's mean score over its scored repeats (tasks never scored: absent)."""
    scores: dict[str, list[int]] = defaultdict(list)
    for r in records:
        if r["status"] in SCORED:
            scores[r["task"]].append(int(r["score"]))
    return {t: sum(s) / len(s) for t, s in scores.items()}


def dedicated_nodes(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Whether the tasks ran on nodes dedicated to their profile, from the
    conditions recorded on each task's node (tasks that never got one are not
    counted): ``dedicated_nodes`` is True when all did, False when any ran on
    a shared node, None when that is unknown (nodes unreadable, no task
    started, or results from before it was recorded)."""
    conds = [r["conditions"] for r in records if "dedicated_node" in (r.get("conditions") or {})]
    on = sum(1 for c in conds if c["dedicated_node"] is True)
    off = sum(1 for c in conds if c["dedicated_node"] is False)
    unknown = len(conds) - on - off
    verdict = False if off else (None if unknown or not conds else True)
    reason = next(
        (c["placement_reason"] for c in conds
         if c["dedicated_node"] is not True and c.get("placement_reason")),
        "",
    )  # fmt: skip
    return {
        "dedicated_nodes": verdict,
        "on_dedicated": on,
        "on_shared": off,
        "unknown": unknown,
        "reason": reason,
    }


def dedicated_text(d: Mapping[str, Any]) -> str | None:
    """One line for a run that did not (or may not) have dedicated nodes."""
    if d["dedicated_nodes"] is True or not (d["on_shared"] or d["unknown"]):
        return None
    if d["on_shared"]:
        n = d["on_shared"] + d["on_dedicated"] + d["unknown"]
        text = f"dedicated nodes: no: {d['on_shared']} of {n} tasks ran on shared nodes"
    else:
        text = f"dedicated nodes: unknown for {d['unknown']} tasks"
    return text + (f" ({d['reason']})" if d["reason"] else "")


def summarize(records: Sequence[Mapping[str, Any]], *, max_attempts: int) -> dict[str, Any]:
    status = Counter(r["status"] for r in records)
    scores = task_scores(records)
    n = len(scores)
    rate = sum(scores.values()) / n if n else None
    lo, hi = wilson(sum(scores.values()), n)
    infra = [r for r in records if r["status"] == INFRA]
    k = max((int(r["attempts"]) for r in infra), default=max_attempts)
    scored = status[PASS] + status[FAIL]
    line = f"{scored} scored, {len(infra)} infra-failed after {k} attempts"
    if status[ERROR]:
        line += f", {status[ERROR]} broken (not scored)"
    failures = {
        s: dict(sorted(Counter(r["reason"] for r in records if r["status"] == s).items()))
        for s in (FAIL, ERROR, INFRA)
    }
    return {
        "tasks": len({r["task"] for r in records}),
        "repeats": max((int(r.get("repeat", 0)) for r in records), default=-1) + 1,
        "results": len(records),
        "scored": scored,
        "passed": status[PASS],
        "failed": status[FAIL],
        "errors": status[ERROR],
        "infra_failed": len(infra),
        "attempts": k,
        "retried": sum(1 for r in records if r.get("retried")),
        "scored_tasks": n,
        "pass_rate": None if rate is None else round(rate, 6),
        "ci95": None if not n else [round(lo, 6), round(hi, 6)],
        "ci_method": "wilson",
        "phases": _phase_stats(records),
        "failures": failures,
        "conditions": dedicated_nodes(records),
        "flaky": flaky_tasks(records),
        "complete": not infra and not status[ERROR],
        "line": line,
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def render_text(summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> str:
    rows = [("task", "rep", "status", "score", "att", "reason", "node", "total_s")]
    for r in records:
        total = (r.get("phases") or {}).get("total_s")
        rows.append((
            r["task"], str(r.get("repeat", 0)), r["status"],
            "-" if r.get("score") is None else str(r["score"]), str(r["attempts"]),
            r["reason"] + (" (retried)" if r.get("retried") and r["status"] != INFRA else ""),
            str(r.get("node") or "-"), "-" if total is None else f"{total:.1f}",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    s = summary
    lines.append("")
    if s["scored_tasks"]:
        lo, hi = s["ci95"]
        lines.append(
            f"pass rate {_pct(s['pass_rate'])} over {s['scored_tasks']} scored tasks "
            f"(95% CI {_pct(lo)}-{_pct(hi)}, Wilson); passed {s['passed']}, failed {s['failed']}"
        )
    else:
        lines.append("pass rate: no task was scored")
    for status, title in ((FAIL, "failed"), (ERROR, "broken"), (INFRA, "infra-failed")):
        if s["failures"][status]:
            reasons = ", ".join(f"{k} {v}" for k, v in s["failures"][status].items())
            lines.append(f"{title} by reason: {reasons}")
    if s["flaky"]:
        flaky = ", ".join(f"{f['task']} ({'/'.join(f['outcomes'])})" for f in s["flaky"])
        lines.append(f"flaky over {s['repeats']} repeats: {flaky}")
    elif s["repeats"] > 1:
        lines.append(f"flaky over {s['repeats']} repeats: none")
    if (dedicated := dedicated_text(s["conditions"])) is not None:
        lines.append(dedicated)
    if s["phases"]:
        lines.append("")
        lines.append(f"{'phase':<18}{'n':>5}{'p50':>9}{'p90':>9}{'max':>9}")
        for name, st in s["phases"].items():
            lines.append(
                f"{name:<18}{st['n']:>5}{st['p50']:>9.2f}{st['p90']:>9.2f}{st['max']:>9.2f}"
            )
    lines.append("")
    lines.append(s["line"] + ("" if s["complete"] else ": the result has holes"))
    return "\n".join(lines) + "\n"
