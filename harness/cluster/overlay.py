"""The local cluster's Sandman overlay, and what both deployment modes share.

Both modes (in-cluster, the default with the real node; host processes,
without it or with ``--host-components``) start from the same rendered
manifests: ``manifests/overlays/local`` under an overlay the harness writes
into ``<state>/sandman-overlay`` exactly as `sandman install` does (images
from the local registry at the dev version). In-cluster applies all of it;
host mode applies the namespace, the policy ConfigMap and the webhook
configurations (their clientConfig pointed at the host process).

The policy lives in the ConfigMap ``sandman-system/sandman-policy`` in both
modes, and every webhook instance watches it; ``PolicyHandle.write`` waits
until each instance has loaded the new text (its reload counter moved).
"""

from __future__ import annotations

import copy
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.contract import NAMESPACE
from sandman.harness.cluster.config import ClusterConfig
from sandman.harness.probes import insecure_context
from sandman.install import apply as ap
from sandman.install import render
from sandman.install.images import Registry

POLICY_CONFIGMAP = "sandman-policy"
POLICY_KEY = "policy.yaml"
LOCAL_BASE = "overlays/local"
# Seconds every webhook instance gets to load a written policy (a watch event:
# normally well under a second).
POLICY_LOAD_TIMEOUT_S = 30.0
RELOADS = "sandman_webhook_policy_reloads_total"
ERRORS = "sandman_webhook_policy_errors_total"


def reaper_off_patch() -> dict[str, Any]:
    """Test sessions run their own reapers, scoped to their namespaces."""
    return {
        "target": {"kind": "Deployment", "name": "sandman-reaper"},
        "patch": "- op: replace\n  path: /spec/replicas\n  value: 0\n",
    }


def install_options(cfg: ClusterConfig, version: str) -> render.InstallOptions:
    return render.InstallOptions(
        version=version,
        registry=Registry.parse(cfg.real_node.registry),
        base=LOCAL_BASE,
        patches=() if cfg.deploy_reaper else (reaper_off_patch(),),
    )


def path(cfg: ClusterConfig) -> Path:
    return cfg.state_dir / "sandman-overlay"


def write(cfg: ClusterConfig, version: str) -> Path:
    """``<state>/sandman-overlay``: a copy of the manifests and the images."""
    return ap.write_overlay(path(cfg), install_options(cfg, version))


def kubectl(binary: Path, kubeconfig: Path) -> ap.Kubectl:
    return ap.Kubectl(str(binary), str(kubeconfig))


def rendered(kc: ap.Kubectl, overlay: Path) -> list[dict[str, Any]]:
    return ap.documents(ap.render_overlay(kc, overlay))


def pick(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for d in docs:
        if d.get("kind") == kind and d["metadata"]["name"] == name:
            return d
    raise KeyError(f"{kind}/{name} not in the rendered manifests")


def url_webhook_configurations(
    docs: list[dict[str, Any]], url: str, ca_bundle: str | None
) -> list[dict[str, Any]]:
    """The rendered webhook configurations, pointed at a URL instead of the Service."""
    out = []
    for kind in ap.WEBHOOK_KINDS:
        doc = copy.deepcopy(pick(docs, kind, "sandman"))
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": url + path}
            if ca_bundle:
                hook["clientConfig"]["caBundle"] = ca_bundle
        out.append(doc)
    return out


# -- the policy --------------------------------------------------------------------
def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def webhook_counters(url: str) -> tuple[float, float]:
    """(policy reloads, policy errors) of one webhook instance, from its /metrics."""
    with urllib.request.urlopen(url, context=insecure_context(), timeout=5) as r:
        text = r.read().decode()
    return _metric(text, RELOADS), _metric(text, ERRORS)


class PolicyHandle:
    """Read and write the cluster's sandbox policy; writes wait until it is in force.

    Failure it prevents: a test that edits the policy and creates a pod at
    once races the webhooks' watch and sees the old rules (flaky denials).
    ``metrics_urls`` lists every webhook instance now serving. Not thread-safe.
    """

    def __init__(self, core: CoreV1Api, metrics_urls: Callable[[], list[str]]) -> None:
        self.core = core
        self.metrics_urls = metrics_urls

    def read(self) -> str:
        cm = self.core.read_namespaced_config_map(POLICY_CONFIGMAP, NAMESPACE)
        return str((cm.data or {}).get(POLICY_KEY, ""))

    def write(self, text: str, timeout_s: float = POLICY_LOAD_TIMEOUT_S) -> None:
        if text == self.read():
            return
        urls = self.metrics_urls()
        before = {u: webhook_counters(u) for u in urls}
        self.core.patch_namespaced_config_map(
            POLICY_CONFIGMAP, NAMESPACE, {"data": {POLICY_KEY: text}}
        )
        deadline = time.monotonic() + timeout_s
        pending = set(urls)
        while pending and time.monotonic() < deadline:
            for u in sorted(pending):
                reloads, errors = webhook_counters(u)
                if errors > before[u][1]:
                    raise ValueError(f"the webhook at {u} rejected the policy (see its log)")
                if reloads > before[u][0]:
                    pending.discard(u)
            time.sleep(0.1)
        if pending:
            raise TimeoutError(f"policy not loaded within {timeout_s}s by {sorted(pending)}")

    # A file-like face for code written when the policy was a file on the host
    # (`deployment.policy_file.read_text()` / `.write_text(text)`).
    def read_text(self) -> str:
        return self.read()

    def write_text(self, text: str) -> None:
        self.write(text)


def apply_policy_configmap(core: CoreV1Api, docs: list[dict[str, Any]]) -> None:
    """Create the rendered policy ConfigMap if it is missing (never overwrite an edit)."""
    cm = pick(docs, "ConfigMap", POLICY_CONFIGMAP)
    try:
        core.create_namespaced_config_map(NAMESPACE, cm)
    except ApiException as e:
        if e.status != 409:
            raise


def dump(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)
