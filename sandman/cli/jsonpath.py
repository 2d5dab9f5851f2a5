r"""`-o jsonpath=TEMPLATE`: the part of kubectl's JSONPath that people type (pure).

A template is text with ``{...}`` blocks, as kubectl's:

- ``{.a.b}``: a field; ``{.items[*].name}``: every item's (joined by spaces);
  ``{.items[0].name}``, ``{.items[-1].name}``, ``{.items[0:2].name}``;
  ``{.metadata.labels['sandman.dev/pool']}`` for keys with dots or slashes;
  ``{$.items[*].name}`` from the root; ``{..name}`` every ``name`` at any depth;
  ``{.items[?(@.state=="Ready")].name}`` a filter (``==``, ``!=``, or a bare
  ``@.field`` meaning present and not false/empty);
- ``{range .items[*]}...{end}``: the body once per item, fields inside
  relative to the item;
- ``{"\n"}``, ``{'\t'}``: literal text with escapes (``\n``, ``\t``, ``\\``).

Strings print as they are, numbers and booleans as JSON (``true``), objects
and lists as compact JSON, a missing field as nothing (kubectl's default,
``--allow-missing-template-keys``).

Worked examples, on what ``sandman ls -o json`` lists (as ``{"items": [...]}``,
the shape of kubectl's List)::

    >>> doc = {"items": [{"name": "sb-a", "state": "Ready", "node": "n1"},
    ...                  {"name": "sb-b", "state": "Pending", "node": None}]}
    >>> render("{.items[*].name}", doc)
    'sb-a sb-b'
    >>> render('{range .items[*]}{.name}{"\t"}{.state}{"\n"}{end}', doc)
    'sb-a\tReady\nsb-b\tPending\n'
    >>> render('{.items[?(@.state=="Ready")].name}', doc)
    'sb-a'
    >>> render("{.items[0]}", doc)
    '{"name":"sb-a","state":"Ready","node":"n1"}'
    >>> render("names: {.items[-1].name}, missing: {.items[0].nope}.", doc)
    'names: sb-b, missing: .'
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Union


class JsonPathError(ValueError):
    pass


# -- the template -------------------------------------------------------------------
@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Expr:
    path: tuple[Any, ...]
    source: str


@dataclass(frozen=True)
class Range:
    path: tuple[Any, ...]
    body: tuple[Node, ...]


Node = Union[Text, Expr, Range]  # noqa: UP007 (a runtime alias the dataclasses name)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), s)


def _blocks(template: str) -> list[tuple[str, str]]:
    """[("text", ...) | ("block", inner)], braces matched outside quotes."""
    out: list[tuple[str, str]] = []
    i, n, text = 0, len(template), []
    while i < n:
        c = template[i]
        if c != "{":
            if c == "}":
                raise JsonPathError(f"unmatched '}}' at {i} in {template!r}")
            text.append(c)
            i += 1
            continue
        if text:
            out.append(("text", "".join(text)))
            text = []
        j, quote = i + 1, None
        while j < n:
            d = template[j]
            if quote:
                if d == "\\":
                    j += 1
                elif d == quote:
                    quote = None
            elif d in "\"'":
                quote = d
            elif d == "{":
                raise JsonPathError(f"'{{' inside a block at {j} in {template!r}")
            elif d == "}":
                break
            j += 1
        else:
            raise JsonPathError(f"unclosed '{{' at {i} in {template!r}")
        out.append(("block", template[i + 1 : j].strip()))
        i = j + 1
    if text:
        out.append(("text", "".join(text)))
    return out


def parse(template: str) -> tuple[Node, ...]:
    """The template's nodes; JsonPathError naming what is wrong."""
    stack: list[tuple[tuple[Any, ...] | None, list[Node]]] = [(None, [])]
    for kind, value in _blocks(template):
        body = stack[-1][1]
        if kind == "text":
            body.append(Text(value))
        elif value == "end":
            if len(stack) == 1:
                raise JsonPathError(f"{{end}} without {{range}} in {template!r}")
            path, inner = stack.pop()
            assert path is not None
            stack[-1][1].append(Range(path, tuple(inner)))
        elif value.startswith("range ") or value == "range":
            stack.append((parse_path(value[5:].strip()), []))
        elif len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0]:
            body.append(Text(_unescape(value[1:-1])))
        else:
            body.append(Expr(parse_path(value), value))
    if len(stack) != 1:
        raise JsonPathError(f"{{range}} without {{end}} in {template!r}")
    return tuple(stack[0][1])


# -- paths ---------------------------------------------------------------------------
# Segments: ("root",), ("key", name), ("all",), ("index", i), ("slice", a, b),
# ("recurse", name), ("filter", path, op, value).
_NAME = re.compile(r"[^.\[\]\s=!<>()@$'\"]+")
_FILTER = re.compile(
    r"\?\(\s*(?P<path>@[^=!<>)]*?)\s*(?:(?P<op>==|!=)\s*(?P<value>.+?))?\s*\)", re.DOTALL
)


def parse_path(text: str) -> tuple[Any, ...]:
    if not text:
        raise JsonPathError("an empty path")
    segs: list[Any] = []
    i, n = 0, len(text)
    if text[0] in "$@":
        segs.append(("root",) if text[0] == "$" else ("current",))
        i = 1
    while i < n:
        if text.startswith("..", i):
            m = _NAME.match(text, i + 2)
            if not m:
                raise JsonPathError(f"a name must follow '..' in {text!r}")
            segs.append(("recurse", m.group(0)))
            i = m.end()
        elif text[i] == ".":
            if text.startswith(".*", i):
                segs.append(("all",))
                i += 2
                continue
            m = _NAME.match(text, i + 1)
            if not m:
                if i + 1 == n and not segs:  # "{.}": the object itself
                    i += 1
                    continue
                raise JsonPathError(f"a name must follow '.' at {i} in {text!r}")
            segs.append(("key", m.group(0)))
            i = m.end()
        elif text[i] == "[":
            j = _close_bracket(text, i)
            segs.append(_bracket(text[i + 1 : j].strip(), text))
            i = j + 1
        else:
            m = _NAME.match(text, i)
            if not m or segs:
                raise JsonPathError(f"unexpected {text[i]!r} at {i} in {text!r}")
            segs.append(("key", m.group(0)))  # kubectl takes "{name}" as "{.name}"
            i = m.end()
    return tuple(segs)


def _close_bracket(text: str, start: int) -> int:
    depth, quote = 0, None
    for j in range(start, len(text)):
        d = text[j]
        if quote:
            if d == quote:
                quote = None
        elif d in "\"'":
            quote = d
        elif d == "[":
            depth += 1
        elif d == "]":
            depth -= 1
            if depth == 0:
                return j
    raise JsonPathError(f"unclosed '[' in {text!r}")


def _bracket(inner: str, whole: str) -> tuple[Any, ...]:
    if inner == "*":
        return ("all",)
    if len(inner) >= 2 and inner[0] in "\"'" and inner[-1] == inner[0]:
        return ("key", inner[1:-1])
    if re.fullmatch(r"-?\d+", inner):
        return ("index", int(inner))
    if m := re.fullmatch(r"(-?\d*):(-?\d*)", inner):
        a, b = (int(x) if x else None for x in m.groups())
        return ("slice", a, b)
    if m := _FILTER.fullmatch(inner):
        value = None
        if m["op"]:
            raw = m["value"].strip()
            if len(raw) >= 2 and raw[0] in "\"'" and raw[-1] == raw[0]:
                value = raw[1:-1]
            else:
                try:
                    value = json.loads(raw)
                except ValueError:
                    raise JsonPathError(f"a filter compares with a literal: {raw!r}") from None
        return ("filter", parse_path(m["path"]), m["op"], value)
    raise JsonPathError(f"[{inner}] in {whole!r}: use [N], [*], [A:B], ['key'] or [?(@.f==v)]")


_MISSING = object()


def _children(v: Any) -> list[Any]:
    if isinstance(v, dict):
        return list(v.values())
    if isinstance(v, list):
        return list(v)
    return []


def _descendants(v: Any) -> list[Any]:
    out = [v]
    for c in _children(v):
        out.extend(_descendants(c))
    return out


def evaluate(path: tuple[Any, ...], current: Any, root: Any) -> list[Any]:
    """Every value ``path`` reaches (none for a missing field)."""
    values = [current]
    for seg in path:
        kind, nxt = seg[0], []
        for v in values:
            if kind == "root":
                nxt.append(root)
            elif kind == "current":
                nxt.append(v)
            elif kind == "key":
                if isinstance(v, dict) and seg[1] in v:
                    nxt.append(v[seg[1]])
            elif kind == "all":
                nxt.extend(_children(v))
            elif kind == "index":
                if isinstance(v, list) and -len(v) <= seg[1] < len(v):
                    nxt.append(v[seg[1]])
            elif kind == "slice":
                if isinstance(v, list):
                    nxt.extend(v[seg[1] : seg[2]])
            elif kind == "recurse":
                for d in _descendants(v):
                    if isinstance(d, dict) and seg[1] in d:
                        nxt.append(d[seg[1]])
            elif kind == "filter":
                _, fpath, op, want = seg
                for item in _children(v):
                    got = evaluate(fpath, item, root)
                    if op is None:
                        keep = bool(got) and got[0] not in (None, False, "", [], {})
                    else:
                        keep = (bool(got) and got[0] == want) == (op == "==")
                    if keep:
                        nxt.append(item)
        values = nxt
    return values


# -- rendering --------------------------------------------------------------------------
def show(v: Any) -> str:
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    return json.dumps(v, separators=(",", ":"))


def _render(nodes: tuple[Node, ...], current: Any, root: Any, out: list[str]) -> None:
    for node in nodes:
        if isinstance(node, Text):
            out.append(node.text)
        elif isinstance(node, Expr):
            out.append(" ".join(show(v) for v in evaluate(node.path, current, root)))
        else:
            items = evaluate(node.path, current, root)
            if len(items) == 1 and isinstance(items[0], list):
                items = items[0]  # {range .items}: its elements, as {range .items[*]}
            for item in items:
                _render(node.body, item, root, out)


def render(template: str | tuple[Node, ...], doc: Any) -> str:
    """``template`` applied to ``doc``."""
    nodes = parse(template) if isinstance(template, str) else template
    out: list[str] = []
    _render(nodes, doc, doc, out)
    return "".join(out)


def output_template(value: str) -> str | None:
    """The TEMPLATE of ``-o jsonpath=TEMPLATE`` (kubectl also takes
    ``jsonpath='{...}'`` with the quotes kept by the shell); None for another format.

    >>> output_template("jsonpath={.items[*].name}")
    '{.items[*].name}'
    >>> output_template("jsonpath='{.name}'"), output_template("json")
    ('{.name}', None)
    """
    kind, sep, template = value.partition("=")
    if kind != "jsonpath" or not sep:
        return None
    if len(template) >= 2 and template[0] in "'\"" and template[-1] == template[0]:
        template = template[1:-1]
    return template
