"""What a pool is: a name, a pod template and a size, as a ReplicaSet manifest."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandman.client.sandbox import build_pod
from sandman.contract import (
    ANN_CLAIMED_AT,
    ANN_CLAIMED_BY,
    ANN_POOL_IMAGE,
    ANN_POOL_STATUS,
    CLAIM_HELD,
    LABEL_POOL,
    LABEL_STATE,
    POOL_RS_PREFIX,
    STATE_CLAIMED,
    STATE_IDLE,
)

__all__ = ["ANN_CLAIMED_AT", "ANN_CLAIMED_BY", "ANN_POOL_STATUS", "CLAIM_HELD", "STATE_CLAIMED"]

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
RS_PREFIX = POOL_RS_PREFIX
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")


def replicaset_name(pool: str) -> str:
    return RS_PREFIX + pool


def pool_selector(pool: str, state: str | None = STATE_IDLE) -> str:
    sel = f"{LABEL_POOL}={pool}"
    return sel + (f",{LABEL_STATE}={state}" if state else "")


def check_name(pool: str) -> str:
    """Pool names end up in a label value and a ReplicaSet name (with a prefix)."""
    if not _NAME.fullmatch(pool):
        raise ValueError(
            f"pool name {pool!r} must be lower-case letters, digits and '-', "
            "start and end alphanumeric, at most 52 characters"
        )
    return pool


@dataclass(frozen=True)
class PoolSpec:
    """A pool of identical sandboxes. ``size`` is the idle pods to keep warm."""

    name: str
    image: str
    size: int = 0
    command: Sequence[str] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, Any] | None = None
    ttl: str | None = None  # the lease a claimed pod gets (from the claim) if not given
    profile: str | None = None
    workspace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] | None = None
    tolerations: Sequence[Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.size < 0:
            raise ValueError(f"pool {self.name}: size must be >= 0, got {self.size}")

    def pod_template(self) -> dict[str, Any]:
        pod = build_pod(
            self.image,
            name=None,
            command=self.command,
            env=self.env,
            resources=self.resources,
            ttl=self.ttl,
            idle_timeout=None,  # idle pool pods are idle by design; the claim sets a lease
            profile=self.profile,
            workspace=self.workspace,
            labels={**self.labels, LABEL_POOL: self.name, LABEL_STATE: STATE_IDLE},
            annotations={},
            node_selector=self.node_selector,
            tolerations=self.tolerations,
        )
        md = pod["metadata"]
        md.pop("generateName", None)
        return {"metadata": md, "spec": pod["spec"]}

    def replicaset(self, replicas: int | None = None) -> dict[str, Any]:
        labels = {LABEL_POOL: self.name}
        return {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": replicaset_name(self.name),
                "labels": labels,
                "annotations": {ANN_POOL_IMAGE: self.image},
            },
            "spec": {
                "replicas": self.size if replicas is None else replicas,
                "selector": {"matchLabels": {LABEL_POOL: self.name, LABEL_STATE: STATE_IDLE}},
                "template": self.pod_template(),
            },
        }
