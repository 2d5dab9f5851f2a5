"""The controlled conditions of an evaluation: what a task's sandbox is given,
and whether the pod that started really has it (pure).

Each condition is set by the runner or by the webhook's ``eval`` profile and
then checked on the pod the API server admitted and the kubelet started, so a
result never claims a condition nobody verified:

- the image: pinned by digest (``pins.py``), checked against the digest the
  kubelet reports it ran (``imageID``);
- Guaranteed QoS: requests = limits from the task's ``resources``, checked on
  ``status.qosClass`` (which counts the daemon's init container too);
- dedicated nodes: whatever the profile's nodeSelector/tolerations are,
  recorded as the pod got them, with the node it ran on;
- no reuse: the profile's ``reuse: false`` makes the webhook start the daemon
  with ``--no-reset`` (and refuse claims), checked on the container's argv;
- a fixed environment (``FIXED_ENV``) on the container and on every command;
- no network unless the task asks: the pod carries ``sandman.dev/network:
  none``, which the namespace's NetworkPolicies must isolate
  (``network_isolation`` decides from the policies the run found).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sandman.contract import (
    ANN_INJECTED,
    ANN_PROFILE,
    LABEL_NETWORK,
    LABEL_RUN,
    NETWORK_NONE,
    annotations,
)
from sandman.eval.spec import Task

# Hash seed, time zone and locale: the usual sources of run-to-run drift in
# test suites (set iteration order, timestamps, collation). C.UTF-8 is in
# every glibc since 2.35 and in Debian's for longer; busybox ignores it.
FIXED_ENV = {"PYTHONHASHSEED": "0", "TZ": "UTC", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
NO_RESET_FLAG = "--no-reset"
PROFILE = "eval"


def pod_env(task: Task) -> dict[str, str]:
    return {**dict(task.env), **FIXED_ENV}


def resources(task: Task) -> dict[str, dict[str, str]]:
    """Requests = limits: the pod is Guaranteed QoS at exactly the task's size."""
    res = dict(task.resources)
    return {"requests": dict(res), "limits": dict(res)}


def pod_labels(task: Task, run_id: str) -> dict[str, str]:
    out = {LABEL_RUN: run_id}
    if not task.network:
        out[LABEL_NETWORK] = NETWORK_NONE
    return out


def image_digest_of(image_id: str) -> str:
    """``repo@sha256:...`` (what kubelets report in imageID) -> ``sha256:...``."""
    _, _, digest = image_id.rpartition("@")
    return digest if digest.startswith("sha256:") else ""


def _target(pod: Mapping[str, Any]) -> dict[str, Any]:
    return ((pod.get("spec") or {}).get("containers") or [{}])[0]


def _target_status(pod: Mapping[str, Any]) -> dict[str, Any]:
    name = _target(pod).get("name")
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == name:
            return dict(cs)
    return {}


def status_reported(pod: Mapping[str, Any]) -> bool:
    """The kubelet has reported the target container started (its imageID)."""
    return bool(_target_status(pod).get("imageID"))


def check_pod(pod: Mapping[str, Any], *, digest: str, profile: str = PROFILE) -> list[str]:
    """Every controlled condition the started pod does not meet (empty: all met)."""
    problems = []
    ann = annotations(dict(pod))
    if ann.get(ANN_PROFILE) != profile:
        problems.append(f"the pod is not of profile {profile!r}")
    qos = (pod.get("status") or {}).get("qosClass")
    if qos != "Guaranteed":
        problems.append(f"QoS class is {qos or 'unknown'}, not Guaranteed")
    ran = image_digest_of(_target_status(pod).get("imageID") or "")
    if ran != digest:
        problems.append(f"the node ran image {ran or '(unknown)'}, not the pinned {digest}")
    if NO_RESET_FLAG not in (_target(pod).get("command") or []):
        problems.append(
            f"the daemon was started without {NO_RESET_FLAG} (the profile allows reuse)"
        )
    return problems


def record(pod: Mapping[str, Any], task: Task) -> dict[str, Any]:
    """The conditions as the pod got them, for the task's result."""
    spec = pod.get("spec") or {}
    c = _target(pod)
    status = pod.get("status") or {}
    return {
        "pod": (pod.get("metadata") or {}).get("name"),
        "pod_uid": (pod.get("metadata") or {}).get("uid"),
        "node": spec.get("nodeName"),
        "qos_class": status.get("qosClass"),
        "resources": c.get("resources") or {},
        "node_selector": spec.get("nodeSelector") or {},
        "tolerations": spec.get("tolerations") or [],
        "image_id": _target_status(pod).get("imageID"),
        "no_reset": NO_RESET_FLAG in (c.get("command") or []),
        "network": "allowed" if task.network else NETWORK_NONE,
        "env": pod_env(task),
        "sandman_injected": annotations(dict(pod)).get(ANN_INJECTED),
    }


# -- NetworkPolicy: is a pod labelled sandman.dev/network=none really offline? ----
def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector's verdict on ``labels`` (an empty selector selects all)."""
    sel = selector or {}
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        has = key in labels
        if op == "In" and not (has and labels[key] in values):
            return False
        if op == "NotIn" and has and labels[key] in values:
            return False
        if op == "Exists" and not has:
            return False
        if op == "DoesNotExist" and has:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # unknown operator: the API server would have refused it
    return True


def _has_egress(policy: Mapping[str, Any]) -> bool:
    spec = policy.get("spec") or {}
    types = spec.get("policyTypes")
    if types is None:  # the API server's default: Egress only when egress rules exist
        return "egress" in spec
    return "Egress" in types


def network_isolation(
    policies: Sequence[Mapping[str, Any]], labels: Mapping[str, str]
) -> tuple[bool, list[str], list[str]]:
    """(isolated, isolating policies, policies that let traffic out).

    Policies add up: a pod is isolated for egress once any policy selecting
    it has the Egress type, and then may send what any of them allows. So an
    offline pod needs one such policy and none with an egress rule.
    """
    isolating, leaking = [], []
    for p in policies:
        spec = p.get("spec") or {}
        if not _has_egress(p) or not selects(spec.get("podSelector"), labels):
            continue
        name = str((p.get("metadata") or {}).get("name"))
        (leaking if spec.get("egress") else isolating).append(name)
    return bool(isolating or leaking) and not leaking, isolating, leaking
