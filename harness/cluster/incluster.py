"""Sandman in-cluster on the local cluster: what `sandman install` does, on the real node.

The default whenever the real node runs: the component images are built
(layers cached) and pushed to the node's registry at the dev version, the
overlay (``overlay.py``) is applied with the cluster's kubectl, and `up`
returns once every Deployment rolled out and a dry-run sandbox is injected.
The webhook, reaper (2 replicas, leader-elected) and sandman-scheduler with
its extender run as pods on the real node; the apiserver reaches the webhook
through its Service's ClusterIP (kube-proxy), as on any cluster.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kubernetes.client import AppsV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.client.startup import ready
from sandman.contract import NAMESPACE
from sandman.harness.cluster import admission, overlay
from sandman.harness.cluster.binaries import Binaries
from sandman.harness.cluster.components import Layout
from sandman.harness.cluster.config import ClusterConfig
from sandman.harness.cluster.process import ManagedProcess
from sandman.harness.images.build import ImageBuilder
from sandman.harness.images.registry import Registry
from sandman.harness.kube import api_client, raw, started_since
from sandman.install import apply as ap
from sandman.install.images import COMPONENTS

WEBHOOK = "sandman-webhook"
REAPER = "sandman-reaper"
# Holds the apiserver's admission client CA (manifests/overlays/local).
CLIENT_CA_CONFIGMAP = "sandman-apiserver-client-ca"
WEBHOOK_PORT = 8443  # the container port (manifests/webhook/deployment.yaml)
# Seconds for the Deployments to roll out: a cold node pulls ~60 MB of images
# from the local registry and starts six Python processes on 2 cores.
ROLLOUT_TIMEOUT_S = 300
# component -> (pod label app.kubernetes.io/name, metrics port, scheme), as
# the manifests set them.
METRICS = {
    "webhook": (WEBHOOK, WEBHOOK_PORT, "https"),
    "reaper": ("sandman-reaper", 8080, "http"),
    "extender": ("sandman-scheduler", 8890, "http"),
}
POLL_S = 0.5

Progress = Callable[[str], None]


class InClusterDeployment:
    """Sandman's Deployments on one local cluster's real node. Not thread-safe."""

    mode = "in-cluster"

    def __init__(self, config: ClusterConfig, layout: Layout, progress: Progress) -> None:
        self.config = config
        self.layout = layout
        self.progress = progress
        bins = Binaries.in_cache(config.cache_dir, config.versions)
        self.kubectl = overlay.kubectl(bins.kubectl, layout.admin_kubeconfig)
        self.docs: list[dict[str, Any]] | None = None

    # -- nothing runs on the host ----------------------------------------------------
    def processes(self) -> list[ManagedProcess]:
        return []

    def health_checks(self) -> dict[str, Callable[[], bool]]:
        return {}

    def down(self) -> list[str]:
        return []  # the pods go with the node

    # -- up --------------------------------------------------------------------------
    def build_and_push(self, version: str = "dev") -> str:
        """Every component image (plus `tiny`, which probe pods name) at ``version``
        (default: the dev version of this tree); returns the version."""
        builder = ImageBuilder(self.config.cache_dir, self.progress)
        registry = Registry(self.config.real_node.registry)
        for name in COMPONENTS:
            built = builder.build_and_push(name, registry, version=version)
            version = built.ref.rsplit(":", 1)[1]
        builder.build_and_push("tiny", registry)
        return version

    def apply_version(self, version: str) -> list[dict[str, Any]]:
        """Apply the manifests naming ``version`` (an upgrade when it is new); no wait.

        Forced: the local cluster's manifests are the truth, and a policy a
        test or a developer wrote into the ConfigMap is reset by `up`.
        """
        path = overlay.write(self.config, version)
        self.docs = overlay.rendered(self.kubectl, path)
        self._put_client_ca(self.docs)
        ap.apply(self.kubectl, path, force_conflicts=True)
        return self.docs

    def _put_client_ca(self, docs: list[dict[str, Any]]) -> None:
        """The CA of the apiserver's admission client certificate, where the
        webhook's --client-ca-file reads it (manifests/overlays/local): an
        admin's step, outside the manifests, since the CA is the cluster's."""
        core = self._core()
        try:
            core.create_namespace(overlay.pick(docs, "Namespace", NAMESPACE))
        except ApiException as e:
            if e.status != 409:
                raise
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": CLIENT_CA_CONFIGMAP,
                "namespace": NAMESPACE,
                "labels": {"app.kubernetes.io/part-of": "sandman"},
            },
            "data": {"ca.crt": admission.client_ca(self.layout.pki).read_text()},
        }
        try:
            core.create_namespaced_config_map(NAMESPACE, body)
        except ApiException as e:
            if e.status != 409:
                raise
            core.replace_namespaced_config_map(CLIENT_CA_CONFIGMAP, NAMESPACE, body)

    @property
    def version(self) -> str:
        """The version the applied manifests name (the daemon image's tag)."""
        return ap.daemon_image(self._docs()).rsplit(":", 1)[1]

    def up(self) -> None:
        t0 = time.monotonic()
        version = self.build_and_push()
        self.apply_version(version)
        assert self.docs is not None
        path = overlay.path(self.config)
        self.progress(f"  applied {path} ({len(self.docs)} objects, version {version})")
        self.wait_available(self.docs, progress=lambda m: self.progress(f"  {m.strip()}"))
        self.progress(f"  Sandman in-cluster ({time.monotonic() - t0:.1f}s): {version}")

    def wait_available(
        self,
        docs: list[dict[str, Any]] | None = None,
        progress: Progress = lambda _m: None,
    ) -> None:
        """Return once ``docs``' Deployments (default: all of Sandman's) are
        rolled out and a dry-run sandbox is injected (the webhook answers
        through its Service, which Ready statuses alone do not prove)."""
        docs = docs if docs is not None else self._docs()
        ap.wait_available(self.kubectl, docs, timeout_s=ROLLOUT_TIMEOUT_S, progress=progress)
        ap.verify_injection(self.kubectl, ap.daemon_image(self._docs()))

    def wait_restarted(self, since: datetime) -> None:
        """Return once every Sandman Deployment has its replicas Ready in pods
        started at or after ``since`` (a restart of the node), then as
        `wait_available`. The pods come back in no particular order, and their
        statuses from before the restart still say Ready: until the webhook's
        are really back, every sandbox create is refused (``connection
        refused`` on the Service's ClusterIP)."""
        want = {
            d["metadata"]["name"]: (
                int(d["spec"].get("replicas", 1)),
                ",".join(f"{k}={v}" for k, v in d["spec"]["selector"]["matchLabels"].items()),
            )
            for d in self._docs()
            if d.get("kind") == "Deployment"
        }
        core = self._core()
        deadline = time.monotonic() + ROLLOUT_TIMEOUT_S
        for name, (replicas, selector) in want.items():
            while True:
                live = _serving(self._pods(selector, core))
                fresh = [p for p in live if started_since(p, since)]
                if len(fresh) >= replicas:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"deployment {NAMESPACE}/{name}: {len(fresh)} of {replicas} pods "
                        f"Ready since {since.isoformat()}"
                    )
                time.sleep(POLL_S)
        self.wait_available()

    def _docs(self) -> list[dict[str, Any]]:
        return self.docs or overlay.rendered(self.kubectl, overlay.path(self.config))

    # -- what tests and benchmarks use -------------------------------------------------
    def add_reaper_args(self, *args: str) -> None:
        """Restart the reaper with ``args`` appended (a benchmark's settings,
        e.g. a longer stuck limit); returns once the rollout is done."""
        ops = [
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": a}
            for a in args
        ]
        self.kubectl.run(
            "-n", NAMESPACE, "patch", "deployment", REAPER, "--type=json", "-p", json.dumps(ops)
        )
        self.kubectl.run(
            "-n", NAMESPACE, "rollout", "status", f"deployment/{REAPER}",
            f"--timeout={int(ROLLOUT_TIMEOUT_S)}s",
        )  # fmt: skip

    def _core(self) -> CoreV1Api:
        return CoreV1Api(api_client(self.layout.admin_kubeconfig))

    def _pods(self, selector: str, core: CoreV1Api | None = None) -> list[dict[str, Any]]:
        """Sandman's pods matching the label ``selector`` (plain JSON)."""
        return list(
            raw(
                (core or self._core()).list_namespaced_pod(
                    NAMESPACE, label_selector=selector, _preload_content=False
                )
            )["items"]
        )

    def webhook_pods(self, *, ready_only: bool = True) -> list[dict[str, Any]]:
        pods = self._pods(f"app.kubernetes.io/name={WEBHOOK}")
        return _serving(pods) if ready_only else pods

    @property
    def webhook_url(self) -> str:
        """The webhook Service's ClusterIP (the host reaches it through kube-proxy)."""
        svc = self._core().read_namespaced_service(WEBHOOK, NAMESPACE)
        return f"https://{svc.spec.cluster_ip}:443"

    def metrics_urls(self, component: str) -> list[str]:
        """/metrics of every Ready pod of ``component`` (webhook, reaper, extender);
        the host reaches pod IPs over the bridge."""
        app, port, scheme = METRICS[component]
        pods = _serving(self._pods(f"app.kubernetes.io/name={app}"))
        return [f"{scheme}://{p['status']['podIP']}:{port}/metrics" for p in pods]

    @property
    def policy_file(self) -> overlay.PolicyHandle:
        """The policy as a file-like handle (``read_text``/``write_text``)."""
        return self.policy

    @property
    def policy(self) -> overlay.PolicyHandle:
        return overlay.PolicyHandle(self._core(), lambda: self.metrics_urls("webhook"))

    def _scale(self, name: str, replicas: int) -> None:
        AppsV1Api(api_client(self.layout.admin_kubeconfig)).patch_namespaced_deployment_scale(
            name, NAMESPACE, {"spec": {"replicas": replicas}}
        )

    def stop_webhook(self) -> None:
        """No webhook pod serves (the configurations stay: sandbox creates fail)."""
        self._scale(WEBHOOK, 0)
        deadline = time.monotonic() + ROLLOUT_TIMEOUT_S
        while self.webhook_pods(ready_only=False):
            if time.monotonic() > deadline:
                raise TimeoutError("webhook pods did not go away")
            time.sleep(POLL_S)

    def start_webhook(self) -> None:
        webhook = overlay.pick(self._docs(), "Deployment", WEBHOOK)
        self._scale(WEBHOOK, int(webhook["spec"].get("replicas", 1)))
        self.wait_available([webhook])


def _serving(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods that are Ready and not being deleted."""
    return [p for p in pods if ready(p) and not p["metadata"].get("deletionTimestamp")]
