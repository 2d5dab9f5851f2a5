"""Strict readers for the eval spec: types checked, unknown and duplicated keys
refused, every message naming where (pure).

A benchmark's score is only worth something when everybody reads its spec the
same way, so nothing is read generously: a string where a list is expected is
an error, not a list of characters.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import yaml

from sandman.contract import ContractError, parse_duration

MAX_TIMEOUT = dt.timedelta(hours=24)  # a day: longer than any benchmark task


class SpecError(ValueError):
    """The spec is invalid; the message names where (task id / line and field)."""


class Loader(yaml.SafeLoader):
    """safe_load without duplicated keys (a later copy would silently win)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise SpecError(f"line {key_node.start_mark.line + 1}: key {key!r} appears twice")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def kind(v: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    return names.get(type(v)) or {list: "a list", dict: "a mapping"}.get(type(v), "null")


def text(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise SpecError(f"{where}: expected a string, got {kind(v)}")
    return v


def command(v: Any, where: str) -> tuple[str, ...] | str:
    """A shell line (run by ``sh -c``) or an argv list."""
    if isinstance(v, str) and v.strip():
        return v
    if isinstance(v, list) and v and all(isinstance(a, str) for a in v):
        return tuple(v)
    raise SpecError(f"{where}: expected a command (a shell line or a list of strings)")


def commands(v: Any, where: str) -> tuple[tuple[str, ...] | str, ...]:
    if isinstance(v, str):
        return (command(v, where),)
    if not isinstance(v, list):
        raise SpecError(f"{where}: expected a list of commands, got {kind(v)}")
    return tuple(command(c, f"{where}[{i}]") for i, c in enumerate(v))


def names(v: Any, where: str) -> tuple[str, ...]:
    if isinstance(v, str):  # SWE-bench datasets store these lists as JSON text
        try:
            v = json.loads(v)
        except ValueError:
            raise SpecError(f"{where}: expected a list of test names") from None
    if not isinstance(v, list) or not all(isinstance(n, str) and n for n in v):
        raise SpecError(f"{where}: expected a list of test names")
    return tuple(v)


def mapping(v: Any, where: str, keys: frozenset[str] | None = None) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise SpecError(f"{where}: expected a mapping, got {kind(v)}")
    unknown = sorted(str(k) for k in v if keys is not None and k not in keys)
    if unknown:
        raise SpecError(
            f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(keys or ()))})"
        )
    return v


def timeout(v: Any, where: str) -> dt.timedelta:
    try:
        td = (
            dt.timedelta(seconds=v)
            if isinstance(v, int | float) and not isinstance(v, bool)
            else parse_duration(text(v, where), field=where)
        )
    except (ContractError, OverflowError, ValueError) as e:  # 1e30 overflows timedelta
        raise SpecError(f"{where}: {e}" if not isinstance(e, ContractError) else str(e)) from None
    if td <= dt.timedelta(0) or td > MAX_TIMEOUT:
        raise SpecError(f"{where}: must be positive and at most 24h")
    return td
