"""Daemon injection as a JSON patch (pure: a pod in, patch operations out).

The injection follows Tekton's entrypoint pattern: an init container copies
the static daemon into an emptyDir, and the target container's command is
rewritten to run the daemon first with the original command after ``--``, so
the task image itself stays unmodified. Everything else the pod contract
asks for (id, lease, scheduler, no service-account token) is added here too.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandman.contract import (
    ANN_ENTRYPOINT_FROM,
    ANN_EXPIRES_AT,
    ANN_IDLE_TIMEOUT,
    ANN_INJECTED,
    ANN_MANIFESTS,
    ANN_TOKEN_SHA256,
    ANN_TTL,
    ANN_WORKSPACE,
    DAEMON_ARGV,
    DAEMON_DIR,
    DAEMON_INIT_CONTAINER,
    DAEMON_PORT,
    DAEMON_PORT_NAME,
    DAEMON_RELEASES,
    DAEMON_RUNTIME_DIR,
    DAEMON_SHARED_MOUNT,
    DAEMON_SHARED_VOLUME,
    DAEMON_VOLUME,
    ENV_MANIFESTS,
    ENV_TMPDIR_ORIG,
    ENV_TOKEN_SHA256,
    ENV_WORKSPACE,
    LABEL_ID,
    SCHEDULER_NAME,
    ContractError,
    annotations,
    daemon_release,
    format_duration,
    format_time,
    is_token_hash,
    parse_duration,
    parse_manifests,
)
from sandman.kube_async import escape_pointer
from sandman.quantity import parse_quantity
from sandman.webhook.hardening import capability_ops
from sandman.webhook.integrity import daemon_dir_mounts, daemon_dir_violation
from sandman.webhook.policy import Profile, RuleSet, profile_of
from sandman.webhook.reinject import strip_injection
from sandman.webhook.rewrite import (
    ImageFacts,
    RewriteError,
    command_for,
    exits_with_command,
    readiness,
    scheduler_for,
)
from sandman.webhook.rewrite import target_index as _target

VOLUME = DAEMON_VOLUME
INIT_CONTAINER = DAEMON_INIT_CONTAINER
OUR_ENV = (ENV_TOKEN_SHA256, ENV_WORKSPACE, ENV_TMPDIR_ORIG, ENV_MANIFESTS)
SA_VOLUME_PREFIX = "kube-api-access-"  # what the ServiceAccount admission plugin adds

# The install step copies the daemon's ~14 MB runtime tree once (~0.05
# CPU-s); its page cache is charged to the container, hence a memory limit
# well above the copy plus the interpreter (~10 MiB). Requests stay tiny so a
# sandbox's accounting is honest without reserving much; limits exist so
# namespaces with a ResourceQuota on limits admit the pod.
INIT_RESOURCES = {
    "requests": {"cpu": "10m", "memory": "32Mi"},
    "limits": {"cpu": "500m", "memory": "128Mi"},
}
# The daemon image's user (harness/images/daemon_image.py): non-root, set
# explicitly so a pod with runAsNonRoot and no runAsUser still starts.
INIT_UID = 65532
# Where the init container sees the pod's emptyDir and the node directory (the
# image itself holds the tree at /.sandman/rt, so neither may be mounted there).
INIT_TARGET = "/sandman-target"
INIT_SHARED = "/sandman-shared"
# Pod Security `restricted` for the install step (per-pod mode).
INIT_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": INIT_UID,
    "runAsGroup": INIT_UID,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
# Shared mode writes into a root-owned node directory: root, still with no
# capabilities and no escalation (a hostPath volume fails `baseline` anyway).
INIT_SECURITY_SHARED = {
    **INIT_SECURITY,
    "runAsNonRoot": False,
    "runAsUser": 0,
    "runAsGroup": 0,
}


class MutationError(ValueError):
    """The pod breaks the contract in a way injection cannot fix (a denial).

    ``rule`` is the id the denial is counted and named under.
    """

    def __init__(self, message: str, rule: str = "contract") -> None:
        super().__init__(message)
        self.rule = rule


# How the daemon's runtime tree reaches a sandbox (docs/performance.md):
# "copy": the init container copies it into the pod's emptyDir (~14 MB per
# pod; passes Pod Security `restricted`). "shared": installed once per node
# into a node directory (hostPath) that every sandbox mounts read-only (0 per
# pod; hostPath is refused by Pod Security `baseline` and `restricted`).
# "node": the node installer (a DaemonSet, manifests/node) placed the tree on
# every node beforehand; the sandbox mounts it read-only and has no install
# step (no init container: saves its start and the kubelet's wait for its
# exit, ~1 s a pod); also hostPath, so also refused by those levels.
DELIVERIES = ("copy", "shared", "node")
HOST_PATH_DELIVERIES = ("shared", "node")
DEFAULT_SHARED_DIR = "/var/lib/sandman/daemon"
# The namespace label with which Pod Security admission enforces a level
# (pod-security.kubernetes.io/enforce); these levels refuse hostPath volumes.
PSA_ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
PSA_NO_HOST_PATH = ("baseline", "restricted")


@dataclass(frozen=True)
class InjectionSettings:
    daemon_image: str
    version: str
    port: int = DAEMON_PORT
    # The install-wide delivery (--daemon-delivery); a policy rule's
    # daemonDelivery overrides it per namespace.
    daemon_delivery: str = "copy"
    # The node directory of the shared delivery (--daemon-shared-dir).
    daemon_shared_dir: str = DEFAULT_SHARED_DIR
    # Whether the node installer runs (--node-installer): the "node"
    # delivery mounts a tree only it places.
    node_installer: bool = False
    scheduler_name: str = SCHEDULER_NAME
    set_scheduler: bool = True
    # Pull Secrets for the daemon image (--daemon-pull-secret): named in the
    # imagePullSecrets of every sandbox with an install step, since the
    # kubelet pulls that image in the sandbox's namespace with the pod's
    # Secrets. The Secret itself is the namespace's (docs/install.md); one
    # that is missing there only makes the kubelet warn and pull without it.
    daemon_pull_secrets: tuple[str, ...] = ()


def delivery_of(pod: dict[str, Any]) -> str:
    """Which delivery an injected ``pod`` got (the choice read back): the
    node directory with (shared) or without (node) the install step, else
    the copy."""
    spec = pod.get("spec") or {}
    if not any(v.get("name") == DAEMON_SHARED_VOLUME for v in spec.get("volumes") or []):
        return "copy"
    inits = spec.get("initContainers") or []
    return "shared" if any(c.get("name") == INIT_CONTAINER for c in inits) else "node"


def delivery_for(
    default: str,
    rule_choice: str | None,
    namespace_labels: Mapping[str, str],
    node_installer: bool = False,
) -> tuple[str, str | None]:
    """(delivery, warning) for a sandbox: the rule's choice, else the
    install-wide one; never "node" where no node installer places the tree
    (the shared delivery installs it from the pod instead), and never a node
    directory ("shared", "node") where Pod Security admission would then
    refuse the pod (the copy passes `restricted`); the warning says which.

    >>> delivery_for("copy", "node", {}, node_installer=False)[0]
    'shared'
    >>> delivery_for("copy", "node", {PSA_ENFORCE_LABEL: "restricted"})[0]
    'copy'
    >>> delivery_for("copy", "node", {}, node_installer=True)
    ('node', None)
    """
    wanted = rule_choice or default
    notes = []
    if wanted == "node" and not node_installer:
        wanted = "shared"
        notes.append(
            "the daemon is installed on the node by this pod (shared delivery), not taken "
            "from the node installer: none runs on this cluster (`sandman install "
            "--delivery node` adds it)"
        )
    level = namespace_labels.get(PSA_ENFORCE_LABEL, "")
    if wanted in HOST_PATH_DELIVERIES and level in PSA_NO_HOST_PATH:
        return "copy", (
            f"the daemon is copied into this pod, not shared from the node: the namespace "
            f"enforces Pod Security {level!r}, which refuses hostPath volumes"
        )
    return wanted, "; ".join(notes) or None


@dataclass
class Mutation:
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sandbox_id: str | None = None
    image_digest: str = ""  # the image whose ENTRYPOINT/CMD the command came from

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
    """The container that gets the daemon (rules in ``rewrite.target_index``)."""
    try:
        return _target(pod)[0]
    except RewriteError as e:
        raise MutationError(str(e)) from None


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


def daemon_command(port: int, original: list[str], flags: Sequence[str] = ()) -> list[str]:
    return [*DAEMON_ARGV, "serve", f"--listen=0.0.0.0:{port}", *flags, "--", *original]


def install_container(settings: InjectionSettings, shared: bool = False) -> dict[str, Any]:
    """The init container that places the daemon's runtime tree (see daemon/install.py)."""
    mounts = [{"name": VOLUME, "mountPath": INIT_TARGET}]
    command = [*DAEMON_ARGV, "install", INIT_TARGET]
    security = INIT_SECURITY
    if shared:
        mounts.append({"name": DAEMON_SHARED_VOLUME, "mountPath": INIT_SHARED})
        command += ["--shared", INIT_SHARED]
        security = INIT_SECURITY_SHARED
    return {
        "name": INIT_CONTAINER,
        "image": settings.daemon_image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "volumeMounts": mounts,
        "resources": INIT_RESOURCES,
        "securityContext": security,
    }


def _daemon_pull_secrets(m: Mutation, spec: dict[str, Any], names: Sequence[str]) -> None:
    """Name ``names`` in the pod's imagePullSecrets, those it does not name yet."""
    current = spec.get("imagePullSecrets")
    have = {s.get("name") for s in current or []}
    for name in names:
        if name in have:
            continue
        _append(m, "/spec/imagePullSecrets", current, {"name": name})
        current = [*(current or []), {"name": name}]
        have.add(name)


def node_release_path(settings: InjectionSettings) -> str:
    """The node path of the injected daemon image's tree (the "node" delivery)."""
    return f"{settings.daemon_shared_dir}/{DAEMON_RELEASES}/{daemon_release(settings.daemon_image)}"


def _daemon_volumes(
    m: Mutation, spec: dict[str, Any], settings: InjectionSettings, delivery: str
) -> None:
    volumes = spec.get("volumes")
    reserved = {VOLUME, DAEMON_SHARED_VOLUME}
    if volumes and any(v.get("name") in reserved for v in volumes):
        raise MutationError(f"volume names {sorted(reserved)} are reserved for the daemon")
    # A container of the pod's own that names a reserved volume would get the
    # daemon's files (in the shared mode: the node directory, read-write).
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(kind) or []:
            for vm in c.get("volumeMounts") or []:
                if vm.get("name") in reserved:
                    raise MutationError(
                        f"container {c.get('name')} mounts {vm.get('name')!r}, a volume "
                        "reserved for the daemon"
                    )
    _append(m, "/spec/volumes", volumes, {"name": VOLUME, "emptyDir": {}})
    if delivery == "shared":
        host = {"path": settings.daemon_shared_dir, "type": "DirectoryOrCreate"}
    elif delivery == "node":
        # "Directory": on a node the installer has not reached yet, the kubelet
        # reports FailedMount and retries until the tree is there, instead of
        # creating an empty directory the daemon cannot start from.
        host = {"path": node_release_path(settings), "type": "Directory"}
    else:
        return
    m.op("add", "/spec/volumes/-", {"name": DAEMON_SHARED_VOLUME, "hostPath": host})


def mutate(
    pod: dict[str, Any],
    *,
    rule: RuleSet,
    settings: InjectionSettings,
    now: dt.datetime,
    new_id: Callable[[], str],
    token_hash_for: Callable[[str], str],
    images: Mapping[str, ImageFacts] | None = None,
    marks: Callable[[str], dict[str, str]] | None = None,
    namespace_labels: Mapping[str, str] | None = None,
) -> Mutation:
    """The patch that turns a labeled pod into a sandbox.

    ``images`` holds what the webhook read from registries for images whose
    ENTRYPOINT/CMD it needs (``rewrite.image_to_resolve``); an image missing
    from it was not looked up (lookups off), which the warnings say.
    ``marks(sandbox id)`` gives the annotations only the webhook can compute
    (the admission marker and the key generation; ``sandman.tokens``).
    """
    m = Mutation()
    # Client-set markers are never trusted: a pod that arrives injected (copied
    # from a sandbox, or forged) loses that injection and is injected anew
    # (webhook/reinject.py); then every container loses the capabilities the
    # policy does not grant (webhook/hardening.py), before ops shift indices.
    pod = strip_injection(pod, m.patch)
    # The user's own mounts, before ours exist: nothing over the daemon's tree.
    shadowing = next(daemon_dir_mounts(pod.get("spec") or {}), None)
    if shadowing is not None:
        v = daemon_dir_violation(*shadowing)
        raise MutationError(f"sandman policy {rule.name!r}: {v.text()}", rule="daemon-dir")
    m.patch += capability_ops(pod, rule)
    ann = annotations(pod)
    spec = pod.get("spec") or {}
    try:
        idx, choice_warnings = _target(pod)
        exit_with_command = exits_with_command(pod, rule.exit_with_command)
    except RewriteError as e:
        raise MutationError(str(e)) from None
    m.warnings += choice_warnings
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
        {
            ANN_INJECTED: settings.version,
            ANN_EXPIRES_AT: format_time(now + ttl),
            **lease_ann,
            **(marks(sid) if marks is not None else {}),
        },
    )

    # -- pod-level fields ---------------------------------------------------
    scheduler = scheduler_for(spec.get("schedulerName"), rule.scheduler, settings.scheduler_name)
    if settings.set_scheduler and scheduler is not None:
        m.op("add", "/spec/schedulerName", scheduler)
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
    delivery, note = delivery_for(
        settings.daemon_delivery,
        rule.daemon_delivery,
        namespace_labels or {},
        settings.node_installer,
    )
    if note:
        m.warnings.append(note)
    _daemon_volumes(m, spec, settings, delivery)
    inits = spec.get("initContainers")
    if inits and any(c.get("name") == INIT_CONTAINER for c in inits):
        raise MutationError(f"init container name {INIT_CONTAINER!r} is reserved")
    if delivery != "node":
        init = install_container(settings, delivery == "shared")
        _guarantee_install(init, container, rule, profile_of(pod, rule))
        # First: copying the daemon depends on nothing, and native sidecars that
        # come later in the list must not hold it up.
        if inits:
            m.op("add", "/spec/initContainers/0", init)
        else:
            m.op("add", "/spec/initContainers", [init])
        _daemon_pull_secrets(m, spec, settings.daemon_pull_secrets)
    facts = (images or {}).get(container.get("image", "")) if images is not None else None
    run = _command(m, container, facts, rule, lookups=images is not None)
    if m.image_digest and facts is not None:
        # Where the command came from, readable from the pod alone (the
        # annotations map exists: the lease annotations were added above).
        image = facts.image if "@" in facts.image else f"{facts.image}@{m.image_digest}"
        m.op("add", f"/metadata/annotations/{escape_pointer(ANN_ENTRYPOINT_FROM)}", image)
    flags = ["--exit-with-command"] if exit_with_command and run else []
    prof = profile_of(pod, rule)
    if prof is not None and not prof.reuse:
        # A profile without reuse (eval: one fresh sandbox per task): the
        # daemon refuses /v1/reset; review.py refuses claims of such pods.
        flags.append("--no-reset")
    if exit_with_command and not run:
        m.warnings.append(
            f"container {container.get('name')}: no command to exit with; "
            "the sandbox stays until released"
        )
    _rewrite_container(
        m, f"/spec/containers/{idx}", container, settings, token_hash, ann, run, flags, delivery
    )
    return m


def _command(
    m: Mutation, c: dict[str, Any], facts: ImageFacts | None, rule: RuleSet, *, lookups: bool
) -> list[str]:
    """What the daemon starts after ``--``: the pod's command, else the image's.

    A lookup that failed is a denial in enforce mode and a warning otherwise
    (the warning says what runs instead); it never silently changes what the
    pod runs.
    """
    name, command, args = c.get("name"), c.get("command"), c.get("args")
    run = command_for(command, args, facts.config if facts else None)
    if run is not None:
        if facts is not None and facts.config is not None:
            m.image_digest = facts.digest
            if facts.note:
                m.warnings.append(f"container {name}: {facts.note}")
            if not run:
                m.warnings.append(
                    f"container {name}: image {facts.image} defines no ENTRYPOINT or CMD; "
                    "only the daemon runs"
                )
        return run
    instead = "its args run as the command under the daemon" if args else "only the daemon runs"
    if facts is not None and facts.error:
        problem = (
            f"container {name}: the ENTRYPOINT/CMD of image {facts.image} could not be read "
            f"from its registry ({facts.error})"
        )
        fix = "set `command` (and `args`) on the container, or make the registry reachable"
        if rule.mode == "enforce":
            raise MutationError(
                f"sandman policy {rule.name!r} (enforce): [image-config] {problem}; fix: {fix}",
                rule="image-config",
            )
        m.warnings.append(f"{problem}; {instead}; fix: {fix}")
    elif not lookups or facts is None:
        m.warnings.append(
            f"container {name}: no command given and its image was not looked up (lookups "
            f"are off, or the policy refuses its registry), so the image's ENTRYPOINT/CMD "
            f"do not run; {instead}"
        )
    return list(args or [])


def _rewrite_container(
    m: Mutation,
    base: str,
    c: dict[str, Any],
    settings: InjectionSettings,
    token_hash: str,
    ann: dict[str, str],
    run: list[str],
    flags: list[str],
    delivery: str,
) -> None:
    name = c.get("name")
    try:
        probe, original_probe, probe_warnings = readiness(c, settings.port)
    except RewriteError as e:
        raise MutationError(str(e)) from None
    m.warnings += probe_warnings
    if original_probe is not None:
        flags = [*flags, f"--readiness-probe={original_probe}"]
    m.op("add", f"{base}/command", daemon_command(settings.port, run, flags))
    if c.get("args") is not None:
        m.op("remove", f"{base}/args")

    env = list(c.get("env") or [])
    kept = [e for e in env if e.get("name") not in OUR_ENV]
    ours = [{"name": ENV_TOKEN_SHA256, "value": token_hash}]
    if ann.get(ANN_WORKSPACE):
        ours.append({"name": ENV_WORKSPACE, "value": ann[ANN_WORKSPACE]})
    if ann.get(ANN_MANIFESTS):
        try:  # files /v1/reset verifies by content
            manifests = parse_manifests(ann[ANN_MANIFESTS])
        except ContractError as e:
            raise MutationError(str(e)) from None
        if manifests:
            ours.append({"name": ENV_MANIFESTS, "value": ",".join(manifests)})
    m.op("add", f"{base}/env", kept + ours)

    mounts = c.get("volumeMounts")
    if mounts and any(v.get("mountPath") == DAEMON_DIR for v in mounts):
        raise MutationError(f"container {name} already mounts something at {DAEMON_DIR}")
    _append(m, f"{base}/volumeMounts", mounts, {"name": VOLUME, "mountPath": DAEMON_DIR})
    # Read-only: a sandbox can run the node's daemon trees, never change them.
    if delivery == "shared":
        m.op(
            "add",
            f"{base}/volumeMounts/-",
            {"name": DAEMON_SHARED_VOLUME, "mountPath": DAEMON_SHARED_MOUNT, "readOnly": True},
        )
    elif delivery == "node":
        m.op(
            "add",
            f"{base}/volumeMounts/-",
            {"name": DAEMON_SHARED_VOLUME, "mountPath": DAEMON_RUNTIME_DIR, "readOnly": True},
        )

    ports = c.get("ports")
    if ports and any(p.get("containerPort") == settings.port for p in ports):
        raise MutationError(f"container {name} uses port {settings.port}, the daemon's port")
    port = {"name": DAEMON_PORT_NAME, "containerPort": settings.port, "protocol": "TCP"}
    if ports and any(p.get("name") == DAEMON_PORT_NAME for p in ports):
        port.pop("name")
    _append(m, f"{base}/ports", ports, port)

    m.op("add", f"{base}/readinessProbe", probe)


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


def _guarantee_install(
    init: dict[str, Any], container: dict[str, Any], rule: RuleSet, prof: Profile | None
) -> None:
    """Requests = limits on the install step too, for a Guaranteed QoS profile.

    The kubelet counts init containers in a pod's QoS class: with the install
    step's small requests under larger limits, a pod whose own containers are
    all Guaranteed is still Burstable (its CPU is shared, its eviction order
    differs), and an eval run measured on it would not be what the profile
    promised. The step's CPU is capped at the container's own CPU limit, so
    the pod asks the scheduler for no more than the task's size.
    """
    if prof is None or not prof.guaranteed_qos:
        return
    limits = dict(INIT_RESOURCES["limits"])
    own = (resolved_resources(container, rule, True).get("limits") or {}).get("cpu")
    if own and parse_quantity(own) < parse_quantity(limits["cpu"]):
        limits["cpu"] = own
    init["resources"] = {"requests": dict(limits), "limits": dict(limits)}


def _apply_resources(m: Mutation, pod: dict[str, Any], rule: RuleSet) -> None:
    prof = profile_of(pod, rule)
    guaranteed = prof is not None and prof.guaranteed_qos
    for i, c in enumerate((pod.get("spec") or {}).get("containers") or []):
        res = resolved_resources(c, rule, guaranteed)
        if res != (c.get("resources") or {}):
            m.op("add", f"/spec/containers/{i}/resources", res)
