"""Daemon injection as a JSON patch (pure: a pod in, patch operations out).

The injection follows Tekton's entrypoint pattern: an init container copies
the static daemon into an emptyDir, and the target container's command is
rewritten to run the daemon first with the original command after ``--``, so
the task image itself stays unmodified. Everything else the pod contract
asks for (id, lease, scheduler, no service-account token) is added here too.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandman.contract import (
    ANN_CONTAINER,
    ANN_EXPIRES_AT,
    ANN_IDLE_TIMEOUT,
    ANN_INJECTED,
    ANN_TOKEN_SHA256,
    ANN_TTL,
    ANN_WORKSPACE,
    DAEMON_DIR,
    DAEMON_INIT_CONTAINER,
    DAEMON_PORT,
    DAEMON_PORT_NAME,
    DAEMON_VOLUME,
    ENV_TMPDIR_ORIG,
    ENV_TOKEN_SHA256,
    ENV_WORKSPACE,
    LABEL_ID,
    SCHEDULER_NAME,
    ContractError,
    annotations,
    format_duration,
    format_time,
    is_token_hash,
    parse_duration,
)
from sandman.kube_async import escape_pointer
from sandman.quantity import parse_quantity
from sandman.webhook.policy import RuleSet, profile_of

VOLUME = DAEMON_VOLUME
INIT_CONTAINER = DAEMON_INIT_CONTAINER
OUR_ENV = (ENV_TOKEN_SHA256, ENV_WORKSPACE, ENV_TMPDIR_ORIG, "TMPDIR")
SA_VOLUME_PREFIX = "kube-api-access-"  # what the ServiceAccount admission plugin adds

# The install step copies one 15 MB file; these fit it with room, and keep a
# sandbox's resource accounting honest without reserving much.
INIT_RESOURCES = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}}


class MutationError(ValueError):
    """The pod breaks the contract in a way injection cannot fix (a denial)."""


@dataclass(frozen=True)
class InjectionSettings:
    daemon_image: str
    version: str
    port: int = DAEMON_PORT
    scheduler_name: str = SCHEDULER_NAME
    set_scheduler: bool = True


@dataclass
class Mutation:
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sandbox_id: str | None = None

    def op(self, op: str, path: str, value: Any = None) -> None:
        entry: dict[str, Any] = {"op": op, "path": path}
        if op != "remove":
            entry["value"] = value
        self.patch.append(entry)


def _put_map_entries(
    m: Mutation, base: str, current: dict[str, str] | None, entries: dict[str, str]
) -> None:
    """Add or replace keys of a string map that may not exist yet."""
    if current is None:
        m.op("add", base, dict(entries))
        return
    for k, v in entries.items():
        m.op("add", f"{base}/{escape_pointer(k)}", v)  # add replaces an existing member


def _append(m: Mutation, path: str, current: list[Any] | None, item: Any) -> None:
    if current is None:
        m.op("add", path, [item])
    else:
        m.op("add", f"{path}/-", item)


def target_index(pod: dict[str, Any]) -> int:
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers:
        raise MutationError("the pod has no containers")
    wanted = annotations(pod).get(ANN_CONTAINER)
    if wanted is None:
        return 0
    for i, c in enumerate(containers):
        if c.get("name") == wanted:
            return i
    names = [c.get("name") for c in containers]
    raise MutationError(f"annotation {ANN_CONTAINER}={wanted!r} names no container (have {names})")


def _lease(pod: dict[str, Any], rule: RuleSet) -> tuple[dt.timedelta, dict[str, str]]:
    ann = annotations(pod)
    added = {}
    try:
        ttl = parse_duration(ann[ANN_TTL], field=ANN_TTL) if ANN_TTL in ann else rule.default_ttl
    except ContractError as e:
        raise MutationError(str(e)) from None
    if ANN_TTL not in ann:
        added[ANN_TTL] = format_duration(ttl)
    if ANN_IDLE_TIMEOUT in ann:
        try:
            parse_duration(ann[ANN_IDLE_TIMEOUT], field=ANN_IDLE_TIMEOUT)
        except ContractError as e:
            raise MutationError(str(e)) from None
    elif rule.default_idle_timeout is not None:
        added[ANN_IDLE_TIMEOUT] = format_duration(rule.default_idle_timeout)
    return ttl, added


def daemon_command(port: int, original: list[str]) -> list[str]:
    return [f"{DAEMON_DIR}/sandmand", "serve", f"--listen=0.0.0.0:{port}", "--", *original]


def mutate(
    pod: dict[str, Any],
    *,
    rule: RuleSet,
    settings: InjectionSettings,
    now: dt.datetime,
    new_id: Callable[[], str],
    token_hash_for: Callable[[str], str],
) -> Mutation:
    """The patch that turns a labeled pod into a sandbox (empty if already one)."""
    m = Mutation()
    ann = annotations(pod)
    if ANN_INJECTED in ann:
        return m  # reinvocation or re-admission: never inject twice
    spec = pod.get("spec") or {}
    idx = target_index(pod)
    container = spec["containers"][idx]

    # -- identity, token, lease ---------------------------------------------
    # Always a fresh id: one copied from a controller's template would be
    # shared by every replica, and the token is derived from it.
    sid = new_id()
    m.sandbox_id = sid
    supplied = ann.get(ANN_TOKEN_SHA256)
    if supplied is not None and not is_token_hash(supplied):
        raise MutationError(f"annotation {ANN_TOKEN_SHA256} must be 64 lowercase hex characters")
    token_hash = supplied or token_hash_for(sid)
    ttl, lease_ann = _lease(pod, rule)
    meta = pod.get("metadata") or {}
    _put_map_entries(m, "/metadata/labels", meta.get("labels"), {LABEL_ID: sid})
    _put_map_entries(
        m,
        "/metadata/annotations",
        meta.get("annotations"),
        {ANN_INJECTED: settings.version, ANN_EXPIRES_AT: format_time(now + ttl), **lease_ann},
    )

    # -- pod-level fields ---------------------------------------------------
    if settings.set_scheduler and spec.get("schedulerName") in (None, "", "default-scheduler"):
        m.op("add", "/spec/schedulerName", settings.scheduler_name)
    backstop = int(rule.max_ttl.total_seconds())
    if spec.get("activeDeadlineSeconds") is None or spec["activeDeadlineSeconds"] > backstop:
        # The kubelet's own backstop: a sandbox outlives no lease, reaper or not.
        m.op("add", "/spec/activeDeadlineSeconds", backstop)
    if not (rule.allow_service_account_token and spec.get("automountServiceAccountToken")):
        m.op("add", "/spec/automountServiceAccountToken", False)
        _remove_token_volume(m, spec)
    if not (rule.allow_service_links and spec.get("enableServiceLinks")):
        m.op("add", "/spec/enableServiceLinks", False)
    if rule.runtime_class_name and not spec.get("runtimeClassName"):
        m.op("add", "/spec/runtimeClassName", rule.runtime_class_name)
    _apply_profile(m, pod, rule)
    _apply_resources(m, pod, rule)

    # -- the daemon: volume, install step, the target container ---------------
    volumes = spec.get("volumes")
    if volumes and any(v.get("name") == VOLUME for v in volumes):
        raise MutationError(f"volume name {VOLUME!r} is reserved for the daemon")
    _append(m, "/spec/volumes", volumes, {"name": VOLUME, "emptyDir": {}})
    mount = {"name": VOLUME, "mountPath": DAEMON_DIR}
    init = {
        "name": INIT_CONTAINER,
        "image": settings.daemon_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/sandmand", "install", DAEMON_DIR],
        "volumeMounts": [mount],
        "resources": INIT_RESOURCES,
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    inits = spec.get("initContainers")
    if inits and any(c.get("name") == INIT_CONTAINER for c in inits):
        raise MutationError(f"init container name {INIT_CONTAINER!r} is reserved")
    # First: copying the daemon depends on nothing, and native sidecars that
    # come later in the list must not hold it up.
    if inits:
        m.op("add", "/spec/initContainers/0", init)
    else:
        m.op("add", "/spec/initContainers", [init])
    _rewrite_container(m, f"/spec/containers/{idx}", container, settings, token_hash, ann)
    return m


def _rewrite_container(
    m: Mutation,
    base: str,
    c: dict[str, Any],
    settings: InjectionSettings,
    token_hash: str,
    ann: dict[str, str],
) -> None:
    name = c.get("name")
    command, args = c.get("command"), c.get("args")
    if command is None and args is not None:
        m.warnings.append(
            f"container {name}: no command, so the image's ENTRYPOINT is unknown to the "
            "webhook; its args run as the command under the daemon"
        )
    elif command is None:
        m.warnings.append(
            f"container {name}: no command given; the image's own entrypoint does not run "
            "(the daemon keeps the sandbox alive)"
        )
    original = [*(command or []), *(args or [])]
    m.op("add", f"{base}/command", daemon_command(settings.port, original))
    if args is not None:
        m.op("remove", f"{base}/args")

    env = list(c.get("env") or [])
    tmpdir = next((e for e in env if e.get("name") == "TMPDIR"), None)
    kept = [e for e in env if e.get("name") not in OUR_ENV]
    ours = [
        {"name": ENV_TOKEN_SHA256, "value": token_hash},
        # Both bootloaders of the frozen daemon unpack into $TMPDIR.
        {"name": "TMPDIR", "value": DAEMON_DIR},
    ]
    if tmpdir is not None:
        ours.append({**tmpdir, "name": ENV_TMPDIR_ORIG})
    if ann.get(ANN_WORKSPACE):
        ours.append({"name": ENV_WORKSPACE, "value": ann[ANN_WORKSPACE]})
    m.op("add", f"{base}/env", kept + ours)

    mounts = c.get("volumeMounts")
    if mounts and any(v.get("mountPath") == DAEMON_DIR for v in mounts):
        raise MutationError(f"container {name} already mounts something at {DAEMON_DIR}")
    _append(m, f"{base}/volumeMounts", mounts, {"name": VOLUME, "mountPath": DAEMON_DIR})

    ports = c.get("ports")
    if ports and any(p.get("containerPort") == settings.port for p in ports):
        raise MutationError(f"container {name} uses port {settings.port}, the daemon's port")
    port = {"name": DAEMON_PORT_NAME, "containerPort": settings.port, "protocol": "TCP"}
    if ports and any(p.get("name") == DAEMON_PORT_NAME for p in ports):
        port.pop("name")
    _append(m, f"{base}/ports", ports, port)

    if c.get("readinessProbe") is not None:
        m.warnings.append(
            f"container {name}: readinessProbe replaced by the daemon's (GET /healthz), so "
            "that Ready means the sandbox accepts commands"
        )
    m.op(
        "add",
        f"{base}/readinessProbe",
        {
            "httpGet": {"path": "/healthz", "port": settings.port},
            "periodSeconds": 1,
            "failureThreshold": 3,
            "timeoutSeconds": 1,
        },
    )


def _remove_token_volume(m: Mutation, spec: dict[str, Any]) -> None:
    """Undo the ServiceAccount admission plugin's token volume.

    That plugin runs before any webhook, so by the time we set
    automountServiceAccountToken: false it has already added a projected
    ``kube-api-access-*`` volume and mounted it into every container.
    Removals go first and by descending index, so later appends still apply.
    """
    volumes = spec.get("volumes") or []
    doomed = {
        v["name"]
        for v in volumes
        if v.get("name", "").startswith(SA_VOLUME_PREFIX)
        and any(
            "serviceAccountToken" in src for src in (v.get("projected") or {}).get("sources") or []
        )
    }
    if not doomed:
        return
    for kind in ("initContainers", "containers"):
        for ci, c in enumerate(spec.get(kind) or []):
            for mi in reversed(range(len(c.get("volumeMounts") or []))):
                if c["volumeMounts"][mi].get("name") in doomed:
                    m.op("remove", f"/spec/{kind}/{ci}/volumeMounts/{mi}")
    for vi in reversed(range(len(volumes))):
        if volumes[vi].get("name") in doomed:
            m.op("remove", f"/spec/volumes/{vi}")


def _apply_profile(m: Mutation, pod: dict[str, Any], rule: RuleSet) -> None:
    prof = profile_of(pod, rule)
    if prof is None:
        return  # the validating webhook names the unknown profile
    spec = pod.get("spec") or {}
    if prof.node_selector:
        _put_map_entries(m, "/spec/nodeSelector", spec.get("nodeSelector"), prof.node_selector)
    if prof.tolerations:
        existing = list(spec.get("tolerations") or [])
        m.op(
            "add",
            "/spec/tolerations",
            existing + [t for t in prof.tolerations if t not in existing],
        )


def resolved_resources(c: dict[str, Any], rule: RuleSet, guaranteed: bool) -> dict[str, Any]:
    """A container's resources after policy defaults (and Guaranteed QoS)."""
    res = dict(c.get("resources") or {})
    req, lim = dict(res.get("requests") or {}), dict(res.get("limits") or {})
    for k, v in rule.default_limits.items():
        lim.setdefault(k, v)
    for k, v in rule.default_requests.items():
        if k in req:
            continue
        # A default request above the container's limit would make the pod
        # invalid; the limit then doubles as the request (as Kubernetes does).
        if k in lim and parse_quantity(v) > parse_quantity(lim[k]):
            continue
        req[k] = v
    if guaranteed:
        for k in ("cpu", "memory"):
            value = lim.get(k) or req.get(k)
            if value:
                req[k] = lim[k] = value
    if req:
        res["requests"] = req
    if lim:
        res["limits"] = lim
    return res


def _apply_resources(m: Mutation, pod: dict[str, Any], rule: RuleSet) -> None:
    prof = profile_of(pod, rule)
    guaranteed = prof is not None and prof.guaranteed_qos
    for i, c in enumerate((pod.get("spec") or {}).get("containers") or []):
        res = resolved_resources(c, rule, guaranteed)
        if res != (c.get("resources") or {}):
            m.op("add", f"/spec/containers/{i}/resources", res)
