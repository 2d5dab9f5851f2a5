"""The peer's objects (agent-sandbox v1beta1), built and read as plain dicts.

Pure: what a `Sandbox`, `SandboxTemplate`, `SandboxWarmPool` and
`SandboxClaim` look like on the wire, and how to read readiness and the pod
behind a claim from their status. The shapes follow the peer's Go types
(``api/v1beta1``, ``extensions/api/v1beta1``); the pod behind an adopted
sandbox is named by the ``agents.x-k8s.io/pod-name`` annotation.
"""

from __future__ import annotations

from typing import Any

from sandman.kube_async import Resource

SANDBOX_GROUP = "agents.x-k8s.io"
EXTENSIONS_GROUP = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"  # the storage version: the only one served without its webhook

SANDBOXES = Resource(SANDBOX_GROUP, VERSION, "sandboxes")
TEMPLATES = Resource(EXTENSIONS_GROUP, VERSION, "sandboxtemplates")
WARMPOOLS = Resource(EXTENSIONS_GROUP, VERSION, "sandboxwarmpools")
CLAIMS = Resource(EXTENSIONS_GROUP, VERSION, "sandboxclaims")

POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"


def pod_template(
    image: str,
    command: list[str],
    *,
    labels: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The peer's ``PodTemplate``: metadata (labels, annotations) and a pod spec."""
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": image, "command": list(command)}],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = list(tolerations)
    return {"metadata": {"labels": dict(labels or {})}, "spec": spec}


def sandbox(name: str, template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{SANDBOX_GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": template},
    }


def sandbox_template(name: str, template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{EXTENSIONS_GROUP}/{VERSION}",
        "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": {"podTemplate": template},
    }


def warm_pool(name: str, template_name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{EXTENSIONS_GROUP}/{VERSION}",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template_name}},
    }


def claim(name: str, pool_name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{EXTENSIONS_GROUP}/{VERSION}",
        "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"warmPoolRef": {"name": pool_name}},
    }


def is_ready(obj: dict[str, Any]) -> bool:
    """The object's Ready condition is True (pods, sandboxes and claims alike)."""
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def claimed_sandbox(claim_obj: dict[str, Any]) -> str | None:
    """The sandbox a claim was bound to, from its status."""
    return ((claim_obj.get("status") or {}).get("sandbox") or {}).get("name") or None


def sandbox_pod(sandbox_obj: dict[str, Any]) -> str:
    """The pod behind a sandbox: an adopted warm pod keeps its own name."""
    meta = sandbox_obj.get("metadata") or {}
    return (meta.get("annotations") or {}).get(POD_NAME_ANNOTATION) or meta["name"]


def served_crd(crd: dict[str, Any], version: str = VERSION) -> dict[str, Any]:
    """A CRD as shipped, reduced to ``version`` with no conversion webhook.

    The peer's CRDs serve two versions through a conversion webhook its
    controller serves; with one version (the storage one) nothing needs
    converting, so the controller runs without its webhook (the way its
    README describes running it against any cluster as a host process).
    """
    out = {**crd, "spec": dict(crd["spec"])}
    versions = [v for v in crd["spec"]["versions"] if v["name"] == version]
    if not versions:
        names = [v["name"] for v in crd["spec"]["versions"]]
        raise ValueError(f"{crd['metadata']['name']}: no version {version} (has {names})")
    out["spec"]["versions"] = [{**versions[0], "served": True, "storage": True}]
    out["spec"].pop("conversion", None)
    return out
