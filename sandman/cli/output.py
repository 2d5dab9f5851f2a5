"""`-o json|yaml|name|wide|jsonpath=TEMPLATE` for every listing command, one implementation.

A listing is rows (plain dicts of JSON values: what ``-o json`` and ``-o
yaml`` print, unchanged) and columns (how the table shows them). As kubectl
does: no ``-o`` prints the table, ``wide`` adds the columns marked wide,
``name`` prints ``KIND/NAME`` per row (and every command that takes a name
accepts that form back, so ``sandman ls -o name | xargs sandman release``
works). ``jsonpath=TEMPLATE`` applies kubectl's JSONPath (sandman.cli.jsonpath)
to the rows as a List, ``{"kind": "List", "items": rows}``, so
``-o jsonpath='{.items[*].name}'`` reads as it does with kubectl.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from sandman.cli import jsonpath

FORMATS = ("json", "yaml", "name", "wide")
ONE_FORMATS = ("json", "yaml", "name")  # commands that print one object (run, claim)


@dataclass(frozen=True)
class Column:
    header: str
    key: str
    wide: bool = False  # only with -o wide
    show: Callable[[Any], str] = lambda v: "<none>" if v is None or v == "" else str(v)


class Formats(tuple[str, ...]):
    """``-o``'s choices: the named formats (what completion offers) and any
    ``jsonpath=TEMPLATE`` (checked by :func:`output_format`)."""

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and (
            value.startswith("jsonpath=") or tuple.__contains__(self, value)
        )


def output_format(formats: Sequence[str]) -> Callable[[str], str]:
    """argparse type for ``-o``: one of ``formats`` or ``jsonpath=TEMPLATE``
    (the template is checked here: a bad one is a usage error)."""

    def check(value: str) -> str:
        value = value.removeprefix("=")  # `-o=json`, as kubectl users type it
        template = jsonpath.output_template(value)
        if template is not None:
            try:
                jsonpath.parse(template)
            except jsonpath.JsonPathError as e:
                raise argparse.ArgumentTypeError(f"bad jsonpath template: {e}") from None
            return f"jsonpath={template}"
        if value not in formats:
            allowed = ", ".join([*formats, "jsonpath=TEMPLATE"])
            raise argparse.ArgumentTypeError(f"{value!r}: use one of {allowed}")
        return value

    return check


def add_output_flag(p: argparse.ArgumentParser, formats: Sequence[str] = FORMATS) -> None:
    p.add_argument(
        "-o",
        "--output",
        type=output_format(formats),
        choices=Formats(formats),
        default=None,
        metavar="FORMAT",
        help=f"{'|'.join(formats)}|jsonpath=TEMPLATE (kubectl's JSONPath, e.g. "
        "'{.items[*].name}'); default: a table",
    )


def emit_one(
    doc: dict[str, Any], output: str | None, *, kind: str, out: TextIO | None = None
) -> bool:
    """Print one object as ``-o json|yaml|jsonpath=`` asks (True), or nothing
    (False: the command prints its own default or name)."""
    out = out or sys.stdout
    template = jsonpath.output_template(output or "")
    if template is not None:
        out.write(jsonpath.render(template, doc))
    elif output == "json":
        out.write(json.dumps(doc) + "\n")  # one line: scripts read it with jq
    elif output == "yaml":
        import yaml

        out.write(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    else:
        return False
    return True


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
    template = jsonpath.output_template(output or "")
    if template is not None:
        out.write(jsonpath.render(template, {"kind": "List", "items": list(rows)}))
    elif output == "json":
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
