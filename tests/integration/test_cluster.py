"""The local cluster is a real control plane: nodes, controllers, scheduling."""

from __future__ import annotations

import json
import subprocess

from kubernetes.client import AppsV1Api, CoreV1Api

from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, KWOK_NODE_SELECTOR, is_ready, on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import api_client, raw
from sandman.harness.testing import kubectl, wait_for


def test_kubectl_lists_ready_kwok_nodes(cluster: LocalCluster) -> None:
    out = json.loads(kubectl(cluster, "get", "nodes", "-l", KWOK_NODE_SELECTOR, "-o", "json"))
    names = sorted(n["metadata"]["name"] for n in out["items"])
    assert len(names) == cluster.config.kwok_nodes
    assert all(is_ready(n) for n in out["items"]), names


def test_built_binaries_report_pinned_version(cluster: LocalCluster) -> None:
    version = cluster.config.versions.kubernetes
    out = subprocess.run(
        [str(cluster.binaries.kube_apiserver), "--version"], capture_output=True, text=True
    ).stdout
    assert out.strip() == f"Kubernetes {version}"
    client = json.loads(kubectl(cluster, "version", "-o", "json"))
    assert client["clientVersion"]["gitVersion"] == version
    assert client["serverVersion"]["gitVersion"] == version


def test_deployment_pods_are_scheduled_and_run(cluster: LocalCluster, namespace: str) -> None:
    apps = AppsV1Api(api_client(cluster.kubeconfig))
    core = CoreV1Api(api_client(cluster.kubeconfig))
    labels = {"app": "web"}
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": on_kwok({"containers": [{"name": "c", "image": KWOK_IMAGE}]}),
                },
            },
        },
    )

    def running() -> list[dict]:
        pods = raw(
            core.list_namespaced_pod(namespace, label_selector="app=web", _preload_content=False)
        )["items"]
        ok = [
            p for p in pods if p["status"].get("phase") == "Running" and p["spec"].get("nodeName")
        ]
        return ok if len(ok) == 3 else []

    pods = wait_for(running, what="3 Running deployment pods")
    assert {p["spec"]["nodeName"] for p in pods} <= {
        f"kwok-node-{i}" for i in range(cluster.config.kwok_nodes)
    }


def test_pod_from_python_client_runs(cluster: LocalCluster, namespace: str) -> None:
    core = CoreV1Api(api_client(cluster.kubeconfig))
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "solo"},
            "spec": on_kwok({"containers": [{"name": "c", "image": KWOK_IMAGE}]}),
        },
    )

    def phase() -> str | None:
        pod = raw(core.read_namespaced_pod("solo", namespace, _preload_content=False))
        return pod["status"].get("phase") if pod["status"].get("phase") == "Running" else None

    assert wait_for(phase, what="pod Running") == "Running"
