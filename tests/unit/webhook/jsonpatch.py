"""A minimal RFC 6902 applier (add/remove/replace/test) to check our patches."""

from __future__ import annotations

import copy
from typing import Any


def _parts(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def apply(doc: Any, patch: list[dict[str, Any]]) -> Any:
    doc = copy.deepcopy(doc)
    for op in patch:
        *parents, last = _parts(op["path"])
        target = doc
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        kind = op["op"]
        if kind == "test":
            got = target[int(last)] if isinstance(target, list) else target[last]
            assert got == op["value"], (op, got)
        elif kind == "remove":
            del target[int(last) if isinstance(target, list) else last]
        elif kind in ("add", "replace"):
            if isinstance(target, list):
                if last == "-":
                    target.append(op["value"])
                elif kind == "add":
                    target.insert(int(last), op["value"])
                else:
                    target[int(last)] = op["value"]
            else:
                if kind == "replace":
                    assert last in target, op
                target[last] = op["value"]
        else:
            raise AssertionError(f"unsupported op {kind}")
    return doc
