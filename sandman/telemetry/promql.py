"""The metric names a PromQL expression reads (pure; a small tokenizer, not a parser).

Used to check that the dashboard and the alert rules name only metrics the
components export. Enough of PromQL for that: strings, label matchers
``{...}``, ranges ``[...]``, grouping lists after ``by``/``without``/
``on``/``ignoring``/``group_left``/``group_right``, function calls and
keywords are skipped; every other identifier is a metric name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
     "group_left", "group_right", "inf", "nan", "atan2"}
)  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", re.IGNORECASE
)
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _strip(expr: str, open_: str, close: str) -> str:
    out, depth = [], 0
    for ch in expr:
        if ch == open_:
            depth += 1
            out.append(" ")
        elif ch == close and depth:
            depth -= 1
            out.append(" ")
        else:
            out.append(" " if depth else ch)
    return "".join(out)


def metric_names(expr: str) -> set[str]:
    s = _STRING.sub('""', expr)
    s = _strip(s, "{", "}")
    s = _strip(s, "[", "]")
    s = _GROUPING.sub(" ", s)
    names = set()
    for m in _IDENT.finditer(s):
        word = m.group(0)
        if word.lower() in KEYWORDS or s[m.end() :].lstrip().startswith("("):
            continue
        if m.start() and (s[m.start() - 1].isdigit() or s[m.start() - 1] in "$."):
            continue  # 1e3, 5m (a duration outside brackets), $var, 0.5
        names.add(word)
    return names


def dashboard_exprs(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expr) for every query of a Grafana dashboard (rows included)."""
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for t in inner.get("targets", []):
                if t.get("expr"):
                    yield inner.get("title", ""), t["expr"]


def rule_exprs(rule_spec: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(alert or record name, expr) for every rule of a rule file / PrometheusRule spec."""
    for group in rule_spec.get("groups", []):
        for rule in group.get("rules", []):
            yield rule.get("alert") or rule.get("record", ""), str(rule["expr"])


def load_dashboard(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)  # type: ignore[no-any-return]


def sample_names(exposition: str) -> set[str]:
    """Names of the samples in a Prometheus text exposition (a /metrics body)."""
    out = set()
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            m = _IDENT.match(line)
            if m:
                out.add(m.group(0))
    return out
