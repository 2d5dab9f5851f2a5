"""No network unless a task asks: the offline NetworkPolicies, in place and effective.

Before any offline task starts, the run makes sure the namespace has the
``sandman-eval-offline-*`` policies (``manifests/sandbox-namespace/
eval-offline.yaml``, created from the installed package when missing and
the runner may) and that no other policy lets an offline pod out
(``conditions.network_isolation``). A run that cannot have both is refused
before it starts: its offline tasks would silently have had network.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from sandman.contract import LABEL_NETWORK, LABEL_SANDBOX, NETWORK_NONE
from sandman.eval.conditions import network_isolation
from sandman.kube_async import ApiError, KubeClient, Resource

NETWORK_POLICIES = Resource("networking.k8s.io", "v1", "networkpolicies")
MANIFEST = ("sandbox-namespace", "eval-offline.yaml")
OFFLINE_LABELS = {LABEL_SANDBOX: "true", LABEL_NETWORK: NETWORK_NONE}


class NetworkNotIsolated(Exception):
    """Offline tasks cannot be run offline in this namespace (the run is refused)."""


def offline_policies() -> list[dict[str, Any]]:
    """The shipped offline policies (package data ``sandman.manifests``)."""
    text = resources.files("sandman.manifests").joinpath(*MANIFEST).read_text()
    return [d for d in yaml.safe_load_all(text) if d]


async def _policies(kube: KubeClient, namespace: str) -> dict[str, Any]:
    try:
        return await kube.list(NETWORK_POLICIES, namespace)  # type: ignore[no-any-return]
    except ApiError as e:
        if e.status not in (401, 403):
            raise
        raise NetworkNotIsolated(
            f"cannot list NetworkPolicies in {namespace} (HTTP {e.status}): the run must see "
            "them to know that offline tasks are offline; grant get/list on "
            "networking.k8s.io networkpolicies, or give tasks `network: true`"
        ) from None


async def ensure_offline(kube: KubeClient, namespace: str) -> dict[str, Any]:
    """Create what is missing, then verify; returns what the run records."""
    have = await _policies(kube, namespace)
    names = {p["metadata"]["name"] for p in have.get("items") or []}
    created = []
    for policy in offline_policies():
        name = policy["metadata"]["name"]
        if name in names:
            continue
        try:
            await kube.create(NETWORK_POLICIES, policy, namespace)
        except ApiError as e:
            if e.status == 409:
                continue  # created meanwhile by another run
            raise NetworkNotIsolated(
                f"namespace {namespace} lacks NetworkPolicy {name} and it could not be "
                f"created (HTTP {e.status}); apply it: kubectl apply -n {namespace} -k "
                "manifests/sandbox-namespace (or give tasks `network: true`)"
            ) from None
        created.append(name)
    have = await _policies(kube, namespace)
    items = have.get("items") or []
    isolated, isolating, leaking = network_isolation(items, OFFLINE_LABELS)
    if not isolated:
        why = (
            f"NetworkPolicies {', '.join(leaking)} let pods labelled {LABEL_NETWORK}="
            f"{NETWORK_NONE} send traffic (policies add up)"
            if leaking
            else "no NetworkPolicy isolates their egress"
        )
        raise NetworkNotIsolated(
            f"namespace {namespace}: offline tasks would have network: {why}; exclude "
            f"{LABEL_NETWORK}={NETWORK_NONE} pods from those policies' podSelector "
            "(as manifests/sandbox-namespace does) or give tasks `network: true`"
        )
    return {"isolating": isolating, "created": created}
