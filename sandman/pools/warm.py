"""Admission ahead of a pool's pods: one server-side dry-run create of its pod.

A dry run goes through every admission webhook and stores nothing, so it
does two things before the ReplicaSet exists: Sandman's webhook reads the
image's ENTRYPOINT/CMD from its registry into its cache (the pool's first
pods are then admitted without waiting for the registry), and a pod the
policy or the registry would refuse is refused now, with the webhook's
message, instead of as a ReplicaSet that silently creates nothing.
"""

from __future__ import annotations

from typing import Any

from sandman.kube_async import PODS, ApiError, KubeClient
from sandman.pools.spec import PoolSpec, replicaset_name


class PoolRefused(ValueError):
    """Admission refuses the pool's pods; the message is the webhook's."""


def sample_pod(spec: PoolSpec) -> dict[str, Any]:
    """One pod as the pool's ReplicaSet would create it (pure)."""
    template = spec.replicaset(replicas=0)["spec"]["template"]
    md = {**template["metadata"], "generateName": f"{replicaset_name(spec.name)}-"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": template["spec"]}


async def dry_run_pod(kube: KubeClient, spec: PoolSpec, namespace: str) -> None:
    try:
        await kube.create(PODS, sample_pod(spec), namespace, dry_run="All")
    except ApiError as e:
        if e.status in (400, 403, 422):
            raise PoolRefused(
                f"pool {spec.name}: its pods would be refused: {e.body.get('message') or e}"
            ) from None
        raise
