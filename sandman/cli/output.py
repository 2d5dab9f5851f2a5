"""`-o json|yaml|name|wide` for every listing command, one implementation.

A listing is rows (plain dicts of JSON values: what ``-o json`` and ``-o
yaml`` print, unchanged) and columns (how the table shows them). As kubectl
does: no ``-o`` prints the table, ``wide`` adds the columns marked wide,
``name`` prints ``KIND/NAME`` per row (and every command that takes a name
accepts that form back, so ``sandman ls -o name | xargs sandman release``
works).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

FORMATS = ("json", "yaml", "name", "wide")


@dataclass(frozen=True)
class Column:
    header: str
    key: str
    wide: bool = False  # only with -o wide
    show: Callable[[Any], str] = lambda v: "<none>" if v is None or v == "" else str(v)


def add_output_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default=None,
        help="json|yaml (the rows), name (KIND/NAME), wide (more columns); default: a table",
    )


def emit(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[Column],
    output: str | None,
    *,
    kind: str,
    name_key: str = "name",
    out: TextIO | None = None,
) -> None:
    """Print ``rows`` in the format ``-o`` asked for."""
    out = out or sys.stdout
    if output == "json":
        out.write(json.dumps(list(rows), indent=2) + "\n")
    elif output == "yaml":
        import yaml

        out.write(yaml.safe_dump(list(rows), sort_keys=False, default_flow_style=False))
    elif output == "name":
        for r in rows:
            out.write(f"{kind}/{r[name_key]}\n")
    else:
        cols = [c for c in columns if output == "wide" or not c.wide]
        cells = [[c.show(r.get(c.key)) for c in cols] for r in rows]
        out.write(table([c.header for c in cols], cells))


def table(headers: Sequence[str], cells: Sequence[Sequence[str]]) -> str:
    """kubectl's layout: left-aligned columns, three spaces apart, no trailing blanks."""
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    lines = []
    for row in [list(headers), *cells]:
        padded = [v.ljust(w) for v, w in zip(row, widths, strict=True)]
        lines.append("   ".join(padded).rstrip())
    return "\n".join(lines) + "\n"


def strip_kind(name: str, *kinds: str) -> str:
    """``pod/x`` -> ``x`` (for the kinds a command takes); other names unchanged."""
    kind, sep, rest = name.partition("/")
    return rest if sep and kind in kinds else name


def duration(seconds: float | None) -> str:
    """kubectl's short ages: 45s, 3m12s, 2h05m, 3d4h."""
    if seconds is None:
        return "<none>"
    s = int(seconds)
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s >= 86400:
        return f"{sign}{s // 86400}d{(s % 86400) // 3600}h"
    if s >= 3600:
        return f"{sign}{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{sign}{s // 60}m{s % 60:02d}s"
    return f"{sign}{s}s"
