"""Strict readers for the policy file: types checked, unknown keys refused (pure).

The policy decides what untrusted code may do, so a policy that does not say
exactly what its author meant must be refused, never read generously: before
these readers, ``allowedRegistries: "127.0.0.1:5000/*"`` (a string) became a
tuple of characters including ``"*"`` (every registry allowed),
``allowPrivileged: "false"`` was true, a typo'd selector operator matched
every namespace and a duplicated key silently overrode the first. Every
message names the field's path (``rules[0].resources.max.cpu``).

A rule set's fields are read through one :class:`Fields` per mapping; its
:meth:`Fields.done` refuses every key nobody read, so a new field only needs
to be read to be allowed.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import yaml

from sandman.contract import ContractError, parse_duration
from sandman.quantity import parse_quantity

# A ConfigMap holds at most 1 MiB; a policy file larger than that is not one.
MAX_POLICY_BYTES = 1 << 20
# Names in denials and Events: short, printable, no markup.
NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?", re.ASCII)
# Kubernetes label keys/values and DNS-1123 names, as the API validates them.
LABEL_VALUE_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", re.ASCII)
LABEL_KEY_RE = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?",
    re.ASCII,
)
DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class PolicyError(ValueError):
    """The policy file itself is invalid (the webhook keeps the last good one)."""


def kind_of(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
        type(None): "null",
    }.get(type(value), type(value).__name__)


class _StrictLoader(yaml.SafeLoader):
    """safe_load, minus what hides intent: duplicated keys and aliases."""

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise PolicyError(
                f"line {event.start_mark.line + 1}: YAML aliases (*{event.anchor}) are not "
                "allowed in a policy; write the value out"
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise PolicyError(
                    f"line {key_node.start_mark.line + 1}: key {key!r} appears twice; "
                    "keep one (a later copy would silently win)"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """The policy document in ``text``, or PolicyError (never another exception)."""
    if len(text.encode()) > MAX_POLICY_BYTES:
        raise PolicyError(f"the policy is larger than {MAX_POLICY_BYTES} bytes")
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.YAMLError as e:
        raise PolicyError(f"not valid YAML: {e}") from None
    except RecursionError:
        raise PolicyError("the policy is nested too deeply") from None


class Fields:
    """One mapping of the policy file, read strictly. Not thread-safe (one parse)."""

    def __init__(self, doc: Any, where: str) -> None:
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise PolicyError(f"{where}: expected a mapping, got {kind_of(doc)}")
        for k in doc:
            if not isinstance(k, str):
                raise PolicyError(f"{where}: key {k!r} must be a string (quote it)")
        self.doc: dict[str, Any] = doc
        self.where = where
        self._read: set[str] = set()

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def raw(self, key: str) -> Any:
        self._read.add(key)
        return self.doc.get(key)

    def has(self, key: str) -> bool:
        return self.doc.get(key) is not None

    def done(self) -> None:
        unknown = sorted(set(self.doc) - self._read)
        if unknown:
            raise PolicyError(
                f"{self.where or 'the policy'}: unknown field(s) {', '.join(unknown)}"
            )

    # -- scalars ------------------------------------------------------------------
    def flag(self, key: str, default: bool) -> bool:
        v = self.raw(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise PolicyError(f"{self.path(key)}: expected true or false, got {kind_of(v)} {v!r}")
        return v

    def text(
        self,
        key: str,
        default: str | None,
        *,
        choices: tuple[str, ...] = (),
        pattern: re.Pattern[str] | None = None,
        what: str = "",
    ) -> str | None:
        v = self.raw(key)
        if v is None:
            return default
        return check_str(v, self.path(key), choices=choices, pattern=pattern, what=what)

    def duration(self, key: str, default: dt.timedelta | None) -> dt.timedelta | None:
        v = self.raw(key)
        if v is None:
            return default
        if not isinstance(v, str):
            raise PolicyError(f"{self.path(key)}: expected a duration like 90m, got {kind_of(v)}")
        try:
            return parse_duration(v, field=self.path(key))
        except ContractError as e:
            raise PolicyError(str(e)) from None

    # -- collections ----------------------------------------------------------------
    def sub(self, key: str) -> Fields:
        return Fields(self.raw(key), self.path(key))

    def items(self, key: str) -> list[Any] | None:
        v = self.raw(key)
        if v is None:
            return None
        if not isinstance(v, list):
            raise PolicyError(f"{self.path(key)}: expected a list, got {kind_of(v)} {v!r}")
        return v

    def str_list(
        self, key: str, *, pattern: re.Pattern[str] | None = None, what: str = ""
    ) -> tuple[str, ...] | None:
        values = self.items(key)
        if values is None:
            return None
        return tuple(
            check_str(v, f"{self.path(key)}[{i}]", pattern=pattern, what=what)
            for i, v in enumerate(values)
        )

    def str_map(
        self,
        key: str,
        *,
        key_pattern: re.Pattern[str] | None = None,
        value_pattern: re.Pattern[str] | None = None,
    ) -> dict[str, str]:
        sub = self.sub(key)
        out = {}
        for k in list(sub.doc):
            if key_pattern is not None and not key_pattern.fullmatch(k):
                raise PolicyError(f"{sub.path(k)}: {k!r} is not a valid key")
            out[k] = check_str(sub.raw(k), sub.path(k), pattern=value_pattern, allow_empty=True)
        return out

    def quantities(self, key: str, names: tuple[str, ...]) -> dict[str, str]:
        sub = self.sub(key)
        out = {}
        for k in list(sub.doc):
            if k not in names:
                raise PolicyError(f"{sub.path(k)}: unknown resource (use {', '.join(names)})")
            v = sub.raw(k)
            if isinstance(v, bool) or not isinstance(v, str | int | float):
                raise PolicyError(f"{sub.path(k)}: expected a quantity like 2Gi, got {kind_of(v)}")
            try:
                q = parse_quantity(str(v))
            except ValueError as e:
                raise PolicyError(f"{sub.path(k)}: {e}") from None
            if q < 0:
                raise PolicyError(f"{sub.path(k)}: {v!r} is negative")
            out[k] = str(v)
        return out


def check_str(
    v: Any,
    where: str,
    *,
    choices: tuple[str, ...] = (),
    pattern: re.Pattern[str] | None = None,
    what: str = "",
    allow_empty: bool = False,
) -> str:
    if not isinstance(v, str):
        raise PolicyError(f"{where}: expected a string, got {kind_of(v)} {v!r} (quote it)")
    if not v and not allow_empty:
        raise PolicyError(f"{where}: must not be empty")
    if choices and v not in choices:
        raise PolicyError(f"{where}: {v!r} is not one of {', '.join(choices)}")
    if pattern is not None and not pattern.fullmatch(v):
        raise PolicyError(f"{where}: {v!r} is not a valid {what or 'value'}")
    return v
