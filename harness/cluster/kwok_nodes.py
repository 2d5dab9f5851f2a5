"""Node objects for kwok's simulated nodes (pure manifests)."""

from __future__ import annotations

from typing import Any

from sandman.contract import LABEL_NODE_KIND
from sandman.harness.cluster.components import KWOK_NODE_ANNOTATION
from sandman.harness.cluster.config import KwokNodeShape

KWOK_NODE_PREFIX = "kwok-node-"
NODE_KIND_LABEL = LABEL_NODE_KIND
KWOK_NODE_SELECTOR = f"{NODE_KIND_LABEL}=kwok"

# Simulated nodes run nothing; only pods that ask for them may land there
# (kwok's own convention). Without the taint, a pod meant for the real node
# could be "Running" on a kwok node while no container exists.
KWOK_TAINT = {"key": KWOK_NODE_ANNOTATION, "value": "fake", "effect": "NoSchedule"}
KWOK_TOLERATION = {
    "key": KWOK_NODE_ANNOTATION,
    "operator": "Equal",
    "value": "fake",
    "effect": "NoSchedule",
}


# kwok never pulls, but every image a test names points at the local registry,
# so that no stray pod could ever reach for one on the internet.
KWOK_IMAGE = "127.0.0.1:5000/sandman/tiny:1"


def on_kwok(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A pod spec that tolerates kwok nodes and is placed only on them."""
    spec = dict(pod_spec)
    spec["tolerations"] = [*spec.get("tolerations", []), KWOK_TOLERATION]
    spec["nodeSelector"] = {**spec.get("nodeSelector", {}), NODE_KIND_LABEL: "kwok"}
    return spec


def kwok_node_name(index: int) -> str:
    return f"{KWOK_NODE_PREFIX}{index}"


def kwok_node(
    name: str,
    shape: KwokNodeShape,
    *,
    images: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Node that kwok will manage: it fills conditions and heartbeats.

    ``status`` is kept on create (as for a registering kubelet), so capacity
    and ``status.images`` chosen here are what the scheduler sees.
    """
    resources = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": str(shape.pods),
        "ephemeral-storage": shape.ephemeral_storage,
    }
    status: dict[str, Any] = {"capacity": dict(resources), "allocatable": dict(resources)}
    if images is not None:
        status["images"] = images
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                NODE_KIND_LABEL: "kwok",
                **(labels or {}),
            },
        },
        "spec": {"taints": [KWOK_TAINT]},
        "status": status,
    }


def is_ready(node: dict[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False
