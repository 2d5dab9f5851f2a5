"""What nodes and pods say about images, read out of API objects (pure).

The index never sees a Kubernetes object: these functions turn a Node or a
Pod (plain JSON dicts, as the watch delivers them) into small frozen reports,
so the index's tests can state facts directly and the reading rules are
tested on real object shapes separately.

Reading rules for a pod bound to a node (``spec.nodeName`` set), per
container (init, sidecar and app containers alike):

- started: its status shows ``state.running`` or ``state.terminated``, or an
  ``imageID``: the image is on the node;
- failed: waiting with a pull-failure reason (ErrImagePull, ImagePullBackOff,
  ...): nothing is being fetched that another pod could share;
- pending: anything else (no status yet, ContainerCreating, PodInitializing):
  the kubelet has pulled or will pull it there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

ContainerState = Literal["started", "pending", "failed"]

# Waiting reasons that mean the image cannot be pulled (kubelet's
# pkg/kubelet/images/types.go); the pod stays, but no pull is in progress.
PULL_FAILURE_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RegistryUnavailable",
        "SignatureValidationFailed",
    }
)


@dataclass(frozen=True)
class ImageEntry:
    """One element of ``node.status.images``: the names of one image, and its size."""

    names: tuple[str, ...]
    size: int


@dataclass(frozen=True)
class NodeReport:
    node: str
    entries: tuple[ImageEntry, ...]


@dataclass(frozen=True)
class ContainerImage:
    ref: str  # as the pod spec names it
    state: ContainerState
    image_id: str = ""  # containerStatuses[].imageID: the content actually run


@dataclass(frozen=True)
class PodReport:
    uid: str
    node: str
    images: tuple[ContainerImage, ...]  # app containers first, then init containers
    active: bool = True  # not Succeeded/Failed: it still occupies the node


def node_report(node: dict[str, Any]) -> NodeReport:
    status = node.get("status") or {}
    entries = []
    for img in status.get("images") or []:
        names = tuple(n for n in img.get("names") or () if isinstance(n, str))
        if names:
            entries.append(ImageEntry(names, int(img.get("sizeBytes") or 0)))
    return NodeReport(node["metadata"]["name"], tuple(entries))


TERMINAL_PHASES = ("Succeeded", "Failed")


def _state(status: dict[str, Any] | None, phase: str) -> ContainerState:
    if status is None:
        if phase in ("Running", "Succeeded"):
            return "started"
        return "failed" if phase == "Failed" else "pending"
    state = status.get("state") or {}
    if "running" in state or "terminated" in state or status.get("imageID"):
        return "started"
    reason = (state.get("waiting") or {}).get("reason", "")
    if reason in PULL_FAILURE_REASONS or phase in TERMINAL_PHASES:
        return "failed"  # no pull is under way that another pod could join
    return "pending"


def pod_report(pod: dict[str, Any]) -> PodReport | None:
    """The images of a bound pod and how far each got; None if not bound."""
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if not node:
        return None
    status = pod.get("status") or {}
    phase = status.get("phase", "")
    by_name: dict[str, dict[str, Any]] = {}
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(key) or ():
            by_name[cs.get("name", "")] = cs
    images = []
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or ():
            ref = c.get("image")
            if not ref:
                continue
            cs = by_name.get(c.get("name", ""))
            images.append(ContainerImage(ref, _state(cs, phase), (cs or {}).get("imageID", "")))
    return PodReport(
        pod["metadata"].get("uid", ""), node, tuple(images), phase not in TERMINAL_PHASES
    )


def pod_requests(pod: dict[str, Any]) -> tuple[str, ...]:
    """The image references a pod being scheduled needs, app containers first."""
    spec = pod.get("spec") or {}
    out: list[str] = []
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or ():
            ref = c.get("image")
            if ref and ref not in out:
                out.append(ref)
    return tuple(out)
