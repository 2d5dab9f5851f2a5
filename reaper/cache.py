"""What the reaper's informer keeps of a sandbox pod (pure).

The reaper decides from its cache (``decide``, ``trust``, the inventory its
metrics export) and re-reads a pod from the API before it deletes anything,
so the cache needs only the fields those read. Keeping whole pods cost ~35 KB
of Python objects per sandbox (a 5.6 KB injected pod: managedFields, the
daemon's init container, env, volumes, capability lists), which put a reaper
with a 1 GiB limit out of memory near 30,000 sandboxes; this view is what
bounds it (docs/scale.md has the bytes per tracked pod, before and after).

Kept: metadata (without managedFields; annotations only under
``sandman.dev/``, since a user's annotations, a kubectl last-applied
configuration among them, can be as large as the pod), the whole status
(phase, conditions, container states: every stuck and idle rule reads it),
the node name, and each container's name and command (``ends_with_command``).
A unit test holds ``decide``/``trust``/the inventory to the same answers on
the view as on the whole pod. Its strings are interned: JSON decoding gives
every pod its own copy of every key and of values like "True", "Ready" or a
node name, and sharing them halves what the view costs (9.6 -> 5.2 KB,
measured with ``sandman bench memory``).
"""

from __future__ import annotations

import sys
from typing import Any

from sandman.contract import PREFIX

# Strings up to this long are shared between pods (keys, condition types and
# statuses, timestamps, node and image names); longer ones (the admission
# marker, a command) are mostly unique.
INTERN_MAX = 64

METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "ownerReferences",
    "labels",
)


def cached_view(pod: dict[str, Any]) -> dict[str, Any]:
    md = pod.get("metadata") or {}
    meta = {k: md[k] for k in METADATA if k in md}
    meta["annotations"] = {
        k: v for k, v in (md.get("annotations") or {}).items() if k.startswith(PREFIX)
    }
    spec = pod.get("spec") or {}
    view: dict[str, Any] = {
        "metadata": meta,
        "spec": {
            "containers": [
                {"name": c.get("name"), "command": c.get("command")}
                for c in spec.get("containers") or ()
            ],
        },
        "status": pod.get("status") or {},
    }
    if spec.get("nodeName"):
        view["spec"]["nodeName"] = spec["nodeName"]
    return _interned(view)  # type: ignore[no-any-return]


def _interned(o: Any) -> Any:
    if isinstance(o, dict):
        return {sys.intern(k): _interned(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_interned(v) for v in o]
    if isinstance(o, str) and len(o) <= INTERN_MAX:
        return sys.intern(o)
    return o
