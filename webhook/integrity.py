"""Checks that hold in every mode (pure: a pod and a rule set in).

A rule set's mode decides what happens to a policy preference (a registry, a
resource limit). These rows guard what other sandboxes and Sandman itself rely
on, so ``warn`` and ``audit`` refuse them as ``enforce`` does
(``updates.HARD_RULES``):

- ``capability-drop``: no container holds a capability of the runtime's
  default set that the rule set does not grant. NET_RAW above all: with it a
  root agent forges ARP on the node's bridge and reads its neighbours'
  traffic, their daemon tokens included. The mutating webhook drops these at
  creation for init and app containers; a ``kubectl debug`` container arrives
  later through ``pods/ephemeralcontainers``, which only the validating
  webhook sees, and would get the runtime's defaults.
- ``daemon-dir``: no mount at or under ``/.sandman`` but the daemon's own
  (a volume there shadows the daemon's tree).
- ``dedicated-nodes``: no sandbox reaches nodes dedicated to another profile
  (a toleration of their taint, or ``spec.nodeName``, which skips the
  scheduler and with it every NoSchedule taint), and a profile's own
  placement stays on the pod.
- ``pool-state``: only a ReplicaSet's pods are idle pool pods (the reaper
  exempts those from their lease and idle timeout).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from typing import Any

from sandman.contract import (
    DAEMON_DIR,
    DAEMON_RUNTIME_DIR,
    DAEMON_SHARED_MOUNT,
    DAEMON_SHARED_VOLUME,
    DAEMON_VOLUME,
    LABEL_STATE,
    STATE_IDLE,
    controller_of,
    labels,
)
from sandman.webhook.confinement import capability
from sandman.webhook.policy import DEFAULT_CAPABILITIES, Profile, RuleSet, Violation, profile_of
from sandman.webhook.subject import Subject

# What a container holds when it asks for nothing: containerd's defaultUnixCaps
# (pkg/oci/spec.go), the largest default among the runtimes Kubernetes uses
# (CRI-O's is a subset). The policy's default keeps all of it but NET_RAW.
RUNTIME_DEFAULT_CAPABILITIES = frozenset({*DEFAULT_CAPABILITIES, "NET_RAW"})
# The daemon's own mounts (webhook/mutate.py): (volume, mount path). Nothing
# else may be mounted at or under DAEMON_DIR.
DAEMON_MOUNTS = frozenset(
    {
        (DAEMON_VOLUME, DAEMON_DIR),
        (DAEMON_SHARED_VOLUME, DAEMON_SHARED_MOUNT),
        (DAEMON_SHARED_VOLUME, DAEMON_RUNTIME_DIR),
    }
)
HOSTNAME_LABEL = "kubernetes.io/hostname"
DEBUG_FIX = (
    "add securityContext.capabilities.drop: [ALL] (kubectl debug --profile=restricted "
    "does) or drop {caps} (kubectl debug --custom=FILE, FILE holding "
    '{{"securityContext": {{"capabilities": {{"drop": {caps}}}}}}})'
)


# -- capability-drop -----------------------------------------------------------------
def held_capabilities(c: dict[str, Any]) -> frozenset[str]:
    """The capabilities a container's process holds, as containerd computes
    them (WithCapabilities): the default set, ``add: [ALL]`` then ``drop:
    [ALL]``, then each added name, then each dropped one (so a drop wins over
    an add of the same name). Privileged holds them all.

    containerd upper-cases a name and prefixes ``CAP_``: a drop of
    ``CAP_NET_RAW`` (or ``CAP_ALL``) removes ``CAP_CAP_NET_RAW``, i.e. nothing,
    so a drop counts only as the bare name. An add is read generously
    (``CAP_X`` as ``X``): that errs towards refusing."""
    sc = c.get("securityContext") or {}
    if sc.get("privileged"):
        return frozenset({"ALL"})
    caps = sc.get("capabilities") or {}
    add = {capability(n) for n in caps.get("add") or []}
    drop = {str(n).upper() for n in caps.get("drop") or []}
    held = set(RUNTIME_DEFAULT_CAPABILITIES)
    if "ALL" in add:
        held.add("ALL")
    if "ALL" in drop:
        held.clear()
    held |= add - {"ALL"}
    held -= drop
    return frozenset(held)


def _kinds(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(kind) or []:
            yield kind, c


def capability_drop(s: Subject) -> Iterator[Violation]:
    granted = {capability(n) for n in (*s.rule.default_capabilities, *s.rule.allowed_capabilities)}
    for kind, c in _kinds(s.spec):
        privileged = bool((c.get("securityContext") or {}).get("privileged"))
        if privileged and s.rule.allow_privileged:
            continue  # the admin's choice (rule privileged says the rest)
        held = held_capabilities(c)
        if "ALL" in held and "ALL" not in granted:
            extra = sorted(RUNTIME_DEFAULT_CAPABILITIES - granted)
        else:
            extra = sorted((held & RUNTIME_DEFAULT_CAPABILITIES) - granted)
        if not extra:
            continue
        name = c.get("name", "?")
        how = "is privileged, so it holds" if privileged else "keeps"
        if privileged:
            yield Violation(
                "capability-drop",
                f"container {name} {how} {extra}, which this rule set does not grant",
                "remove securityContext.privileged",
            )
        elif kind == "ephemeralContainers":
            yield Violation(
                "capability-drop",
                f"debug container {name} {how} {extra}, which the runtime grants by default "
                "and this rule set does not (with NET_RAW a root process forges ARP and reads "
                "other sandboxes' traffic)",
                DEBUG_FIX.format(caps=json.dumps(extra)),
            )
        else:
            yield Violation(
                "capability-drop",
                f"container {name} {how} {extra}, which the runtime grants by default and "
                "this rule set does not",
                f"add {extra} to securityContext.capabilities.drop (or drop ALL)",
            )


# -- daemon-dir ----------------------------------------------------------------------
def container_path(path: Any) -> str:
    """A mount path as the runtime resolves it inside the container: relative
    to /, ``.`` and ``..`` applied, repeated and trailing slashes dropped."""
    return posixpath.normpath("/" + str(path).lstrip("/"))


def under_daemon_dir(path: Any) -> bool:
    p = container_path(path)
    return p == DAEMON_DIR or p.startswith(DAEMON_DIR + "/")


def daemon_dir_mounts(
    spec: dict[str, Any], ours: frozenset[tuple[str, str]] = frozenset()
) -> Iterator[tuple[str, str, str]]:
    """(container, field, path) for every mount or device at or under
    DAEMON_DIR, except ``ours`` (volume, path) in init and app containers."""
    for kind, c in _kinds(spec):
        own = ours if kind != "ephemeralContainers" else frozenset()
        for vm in c.get("volumeMounts") or []:
            path = vm.get("mountPath", "")
            if under_daemon_dir(path) and (vm.get("name"), container_path(path)) not in own:
                yield c.get("name", "?"), f"volumeMounts {vm.get('name')!r}", str(path)
        for vd in c.get("volumeDevices") or []:
            if under_daemon_dir(vd.get("devicePath", "")):
                yield c.get("name", "?"), f"volumeDevices {vd.get('name')!r}", vd["devicePath"]


def daemon_dir_violation(container: str, what: str, path: str) -> Violation:
    return Violation(
        "daemon-dir",
        f"container {container}: {what} at {path!r} is at or under {DAEMON_DIR}, the "
        "daemon's own tree (it would shadow the daemon's files)",
        f"mount it elsewhere (anywhere outside {DAEMON_DIR})",
    )


def daemon_dir(s: Subject) -> Iterator[Violation]:
    for container, what, path in daemon_dir_mounts(s.spec, DAEMON_MOUNTS):
        yield daemon_dir_violation(container, what, path)


# -- dedicated-nodes -------------------------------------------------------------------
Taint = tuple[str, str | None, str | None]  # key, value (None: any), effect (None: any)


def _taints(prof: Profile) -> set[Taint]:
    """The taints a profile's tolerations admit it to. A toleration without a
    key tolerates every taint and dedicates nothing (it is skipped)."""
    out: set[Taint] = set()
    for t in prof.tolerations:
        if t.get("key"):
            value = None if t.get("operator") == "Exists" else str(t.get("value") or "")
            out.add((str(t["key"]), value, t.get("effect") or None))
    return out


def tolerates(t: dict[str, Any], taint: Taint) -> bool:
    """Whether toleration ``t`` admits the pod to some node carrying ``taint``
    (Kubernetes' ToleratesTaint, with None read as "any")."""
    key, value, effect = taint
    t_effect = t.get("effect") or ""
    if t_effect and effect and t_effect != effect:
        return False
    operator = t.get("operator") or "Equal"
    if not t.get("key"):
        return operator == "Exists"
    if t.get("key") != key:
        return False
    return operator == "Exists" or value is None or str(t.get("value") or "") == value


def dedicated_to_others(rule: RuleSet, prof: Profile | None) -> dict[Taint, str]:
    """taint -> the profile whose nodes it keeps, for the taints ``prof`` has
    no toleration of its own for."""
    own = _taints(prof) if prof is not None else set()
    out: dict[Taint, str] = {}
    for other in rule.profiles.values():
        for taint in _taints(other) - own:
            out.setdefault(taint, other.name)
    return out


def dedicated_nodes(s: Subject) -> Iterator[Violation]:
    prof = profile_of(s.pod, s.rule)
    mine = prof.name if prof is not None else "(unknown)"
    reserved = dedicated_to_others(s.rule, prof)
    for t in s.spec.get("tolerations") or []:
        hit = next((name for taint, name in reserved.items() if tolerates(t, taint)), None)
        if hit is not None:
            yield Violation(
                "dedicated-nodes",
                f"toleration {t} admits this sandbox of profile {mine!r} to nodes dedicated "
                f"to profile {hit!r}",
                f"remove the toleration, or create the sandbox with profile {hit!r}",
            )
    node = s.spec.get("nodeName")
    if node and reserved:
        owners = sorted(set(reserved.values()))
        yield Violation(
            "dedicated-nodes",
            f"spec.nodeName={node!r} skips the scheduler and with it the taints that keep "
            f"sandboxes of profile {mine!r} off nodes dedicated to {owners} (the webhook "
            "does not look nodes up)",
            f"remove spec.nodeName and pin with nodeSelector {HOSTNAME_LABEL}: {node} "
            "(scheduled, so the taints hold)",
        )
    if prof is None:
        return
    selector = s.spec.get("nodeSelector") or {}
    lost = {k: v for k, v in prof.node_selector.items() if selector.get(k) != v}
    tolerations = s.spec.get("tolerations") or []
    missing = [t for t in prof.tolerations if t not in tolerations]
    if lost or missing:
        lacks = [f"nodeSelector {lost}"] if lost else []
        lacks += [f"tolerations {missing}"] if missing else []
        yield Violation(
            "dedicated-nodes",
            f"profile {prof.name!r} places its sandboxes on its own nodes; the pod lacks "
            f"{' and '.join(lacks)}",
            "leave nodeSelector and tolerations as the webhook set them",
        )


# -- pool-state ------------------------------------------------------------------------
def pool_state(s: Subject) -> Iterator[Violation]:
    """An idle pod owned by something other than a ReplicaSet would be exempt
    from its lease (reaper/decide.py ``is_idle_pool_pod``) without any pool
    behind it."""
    if labels(s.pod).get(LABEL_STATE) != STATE_IDLE:
        return
    ref = controller_of(s.pod)
    if ref is not None and ref.get("kind") != "ReplicaSet":
        yield Violation(
            "pool-state",
            f"label {LABEL_STATE}={STATE_IDLE} marks an unclaimed warm-pool pod, which only a "
            f"pool's ReplicaSet creates; this pod's controller is a {ref.get('kind')}",
            f"remove label {LABEL_STATE}, or create a pool (sandman pool create)",
        )
