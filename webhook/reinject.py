"""Undo a previous injection before injecting (pure: a pod in, the cleaned pod and ops out).

A pod can arrive at CREATE already carrying an injection: copied from a live
sandbox (``kubectl get -o yaml | kubectl create -f -``, a template made from
one), or forged. Skipping injection when ``sandman.dev/injected`` was present
let anyone who may create pods pick their sandbox id and skip the lease, the
deadline and the defaults (issue 15 item 7). Client-set markers are never
trusted: the previous injection is taken out (its init container, volumes,
mounts, the daemon's command, probe, env and port, the markers), the
original command and readiness probe are put back, and the pod is injected
anew like any other.

A pod that merely uses a reserved name without carrying an injection is left
as it is (injection then refuses it with rule ``contract``): only what is
recognisably ours is removed.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from sandman.contract import (
    ANN_ADMITTED,
    ANN_EXPIRES_AT,
    ANN_INJECTED,
    ANN_KEY_ID,
    DAEMON_ARGV,
    DAEMON_DIR,
    DAEMON_INIT_CONTAINER,
    DAEMON_PORT,
    DAEMON_SHARED_VOLUME,
    DAEMON_VOLUME,
    ENV_TMPDIR_ORIG,
    ENV_TOKEN_SHA256,
    ENV_TOKEN_SHA256_FILE,
    ENV_WORKSPACE,
    annotations,
)
from sandman.kube_async import escape_pointer

# Written by the webhook at admission; a copy's values describe another pod.
SYSTEM_ANNOTATIONS = (ANN_INJECTED, ANN_EXPIRES_AT, ANN_ADMITTED, ANN_KEY_ID)
RESERVED_VOLUMES = frozenset({DAEMON_VOLUME, DAEMON_SHARED_VOLUME})
OUR_ENV = frozenset({ENV_TOKEN_SHA256, ENV_TOKEN_SHA256_FILE, ENV_WORKSPACE, ENV_TMPDIR_ORIG})
# The daemon's argv before ``serve``: today's, and the first releases' static binary.
DAEMON_PREFIXES = ((*DAEMON_ARGV, "serve"), (f"{DAEMON_DIR}/sandmand", "serve"))
READINESS_FLAG = "--readiness-probe="


def _daemon_argv(c: dict[str, Any]) -> tuple[list[str], list[str]] | None:
    """(flags, original command) if ``c`` runs the injected daemon, else None."""
    cmd = c.get("command")
    if not isinstance(cmd, list):
        return None
    for prefix in DAEMON_PREFIXES:
        if tuple(cmd[: len(prefix)]) == prefix:
            rest = [str(a) for a in cmd[len(prefix) :]]
            if "--" in rest:
                i = rest.index("--")
                return rest[:i], rest[i + 1 :]
            return rest, []
    return None


def carries_injection(pod: dict[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    return ANN_INJECTED in annotations(pod) or any(
        _daemon_argv(c) is not None for c in spec.get("containers") or []
    )


def _ours_probe(probe: Any) -> bool:
    get = (probe or {}).get("httpGet") or {} if isinstance(probe, dict) else {}
    return get.get("port") == DAEMON_PORT and get.get("path") in ("/healthz", "/readyz")


def _clean_container(c: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(c)
    # Only the daemon's volumes: a mount of the pod's own under DAEMON_DIR is
    # the user's, and is refused (rule daemon-dir), never silently dropped.
    mounts = [m for m in out.get("volumeMounts") or [] if m.get("name") not in RESERVED_VOLUMES]
    if "volumeMounts" in out:
        out["volumeMounts"] = mounts
    parsed = _daemon_argv(out)
    if parsed is None:
        return out
    flags, original = parsed
    out.pop("args", None)
    if original:
        out["command"] = original
    else:
        out.pop("command", None)
    probe = next((f[len(READINESS_FLAG) :] for f in flags if f.startswith(READINESS_FLAG)), None)
    try:
        restored = json.loads(probe) if probe else None
    except ValueError:
        restored = None
    if isinstance(restored, dict):
        out["readinessProbe"] = restored
    elif _ours_probe(out.get("readinessProbe")):
        out.pop("readinessProbe", None)
    env = []
    for e in out.get("env") or []:
        name = e.get("name")
        if name == "TMPDIR" and e.get("value") == DAEMON_DIR:
            continue  # the first releases pointed TMPDIR at the daemon's dir
        if name == ENV_TMPDIR_ORIG:
            env.append({**e, "name": "TMPDIR"})
        elif name not in OUR_ENV:
            env.append(e)
    if "env" in out:
        out["env"] = env
    if "ports" in out:
        out["ports"] = [p for p in out["ports"] if p.get("containerPort") != DAEMON_PORT]
    return out


def strip_injection(pod: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """``pod`` without a previous injection; the ops that get there are appended
    to ``patch`` (so ops computed on the result apply after them)."""
    injected = carries_injection(pod)
    forged = [k for k in SYSTEM_ANNOTATIONS if k in annotations(pod)]
    if not injected and not forged:
        return pod
    out = copy.deepcopy(pod)
    ann = (out.get("metadata") or {}).get("annotations") or {}
    for key in forged:
        del ann[key]
        patch.append({"op": "remove", "path": f"/metadata/annotations/{escape_pointer(key)}"})
    if not injected:
        return out
    spec = out.setdefault("spec", {})

    def put(path: str, key: str, value: list[Any]) -> None:
        if value:
            spec[key] = value
            patch.append({"op": "replace", "path": path, "value": value})
        else:
            spec.pop(key, None)
            patch.append({"op": "remove", "path": path})

    inits = spec.get("initContainers")
    if inits is not None:
        kept = [_clean_container(c) for c in inits if c.get("name") != DAEMON_INIT_CONTAINER]
        if kept != inits:
            put("/spec/initContainers", "initContainers", kept)
    volumes = spec.get("volumes")
    if volumes is not None:
        kept = [v for v in volumes if v.get("name") not in RESERVED_VOLUMES]
        if kept != volumes:
            put("/spec/volumes", "volumes", kept)
    for i, c in enumerate(spec.get("containers") or []):
        cleaned = _clean_container(c)
        if cleaned != c:
            spec["containers"][i] = cleaned
            patch.append({"op": "replace", "path": f"/spec/containers/{i}", "value": cleaned})
    return out
