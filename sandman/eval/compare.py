"""Two runs of a benchmark side by side: which tasks changed, and whether the
difference is beyond noise (pure).

The two runs score the same tasks, so their outcomes are paired and the test
is McNemar's: only the tasks that changed carry information. Under "no real
difference" a changed task is equally likely to have gone either way, so the
number of pass->fail changes among all changes is Binomial(b + c, 1/2) and
the two-sided exact p-value is 2 * P(X <= min(b, c)) (capped at 1). Exact,
not the chi-square approximation: benchmarks change a handful of tasks, where
the approximation is poor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sandman.eval.summary import dedicated_nodes, task_scores

# The conventional 5% level: "beyond noise" means a difference this large
# would come up by chance less than once in 20 runs of two equal agents.
ALPHA = 0.05


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for b (pass->fail) and c (fail->pass) changes."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def _outcome(mean_score: float) -> str:
    # With repeats, a task passes when most of its scored repeats passed.
    return "pass" if mean_score > 0.5 else "fail"


def _digests(records: Sequence[Mapping[str, Any]]) -> dict[str, str | None]:
    return {r["task"]: r.get("image_digest") for r in records}


def compare(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], *, alpha: float = ALPHA
) -> dict[str, Any]:
    sa, sb = task_scores(a), task_scores(b)
    paired = sorted(set(sa) & set(sb))
    changed = [
        {"task": t, "a": _outcome(sa[t]), "b": _outcome(sb[t])}
        for t in paired
        if _outcome(sa[t]) != _outcome(sb[t])
    ]
    regressions = sum(1 for c in changed if c["a"] == "pass")
    fixes = len(changed) - regressions
    p = mcnemar_exact(regressions, fixes)
    da, db = _digests(a), _digests(b)
    # A run on shared nodes is not measured like one on dedicated nodes: timings
    # and timeouts move with the neighbours' load.
    na, nb = dedicated_nodes(a), dedicated_nodes(b)
    all_a, all_b = {r["task"] for r in a}, {r["task"] for r in b}

    def rate(scores: Mapping[str, float]) -> float | None:
        vals = [_outcome(scores[t]) == "pass" for t in paired]
        return sum(vals) / len(vals) if vals else None

    return {
        "paired": len(paired),
        "pass_rate_a": rate(sa),
        "pass_rate_b": rate(sb),
        "changed": changed,
        "pass_to_fail": regressions,
        "fail_to_pass": fixes,
        "p_value": p,
        "alpha": alpha,
        "beyond_noise": p < alpha,
        "not_scored_in_a": sorted((all_a & all_b) - set(sa)),
        "not_scored_in_b": sorted((all_a & all_b) - set(sb)),
        "only_in_a": sorted(all_a - all_b),
        "only_in_b": sorted(all_b - all_a),
        "image_changed": sorted(t for t in paired if da.get(t) != db.get(t)),
        "dedicated_nodes_a": na["dedicated_nodes"],
        "dedicated_nodes_b": nb["dedicated_nodes"],
        "conditions_differ": na["dedicated_nodes"] != nb["dedicated_nodes"],
    }


def render_compare(c: Mapping[str, Any], name_a: str, name_b: str) -> str:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    lines = [
        f"A: {name_a}",
        f"B: {name_b}",
        f"{c['paired']} tasks scored in both: pass rate {pct(c['pass_rate_a'])} -> "
        f"{pct(c['pass_rate_b'])}",
    ]
    if c["changed"]:
        lines.append(f"changed ({len(c['changed'])}):")
        width = max(len(x["task"]) for x in c["changed"])
        lines += [f"  {x['task']:<{width}}  {x['a']} -> {x['b']}" for x in c["changed"]]
    else:
        lines.append("changed: none")
    for key, title in (
        ("only_in_a", "only in A"),
        ("only_in_b", "only in B"),
        ("not_scored_in_a", "not scored in A"),
        ("not_scored_in_b", "not scored in B"),
        ("image_changed", "ran a different image digest"),
    ):
        if c[key]:
            lines.append(f"{title}: {', '.join(c[key])}")
    if c["dedicated_nodes_a"] is not True or c["dedicated_nodes_b"] is not True:
        word = {True: "yes", False: "no", None: "unknown"}
        line = (
            f"dedicated nodes: A {word[c['dedicated_nodes_a']]}, B {word[c['dedicated_nodes_b']]}"
        )
        lines.append(line + (": the runs' conditions differ" if c["conditions_differ"] else ""))
    verdict = "beyond noise" if c["beyond_noise"] else "within noise"
    lines.append(
        f"McNemar exact test: {c['pass_to_fail']} pass->fail, {c['fail_to_pass']} fail->pass, "
        f"p = {c['p_value']:.4g}: {verdict} (alpha {c['alpha']:g})"
    )
    return "\n".join(lines) + "\n"
