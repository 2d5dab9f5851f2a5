"""Pods of our images run for real on the real node (kubelet + containerd)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import CoreV1Api

from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.kube import raw
from sandman.harness.testing import kubectl, real_pod, wait_for, wait_ready

# Commands that print a marker (for `kubectl logs`) then do the image's job.
COMMANDS = {
    "tiny": ["sh", "-c", "echo tiny-ready; exec httpd -f -v -p 8080 -h /www"],
    "swe": ["sh", "-c", "echo swe-ready; exec sleep infinity"],
}


def events_for(core: CoreV1Api, ns: str, name: str) -> list[dict[str, Any]]:
    items = raw(
        core.list_namespaced_event(
            ns, field_selector=f"involvedObject.name={name}", _preload_content=False
        )
    )["items"]
    return items


@pytest.mark.parametrize("image_name", ["tiny", "swe"])
def test_pod_runs_with_exec_logs_and_ip(
    cluster: LocalCluster,
    core: CoreV1Api,
    namespace: str,
    images: dict[str, str],
    image_name: str,
) -> None:
    core.create_namespaced_pod(namespace, real_pod("p", images[image_name], COMMANDS[image_name]))
    pod = wait_ready(core, namespace, "p")
    assert pod["spec"]["nodeName"] == cluster.config.real_node.name
    ip = pod["status"]["podIP"]
    assert ip.startswith("10.244.0.")

    out = kubectl(cluster, "exec", "-n", namespace, "p", "--", "sh", "-c", "echo hi $(hostname)")
    assert out.strip() == "hi p"
    logs = wait_for(
        lambda: kubectl(cluster, "logs", "-n", namespace, "p"), what="container log output"
    )
    assert f"{image_name}-ready" in logs

    if image_name == "tiny":
        # The pod IP answers from the host, over the local bridge.
        with urllib.request.urlopen(f"http://{ip}:8080/", timeout=5) as resp:
            assert b"sandman tiny image" in resp.read()
        # No Python and no shared libc: busybox alone.
        probe = "command -v python3 || echo no-python; ls /lib* 2>/dev/null | wc -l"
        out = kubectl(cluster, "exec", "-n", namespace, "p", "--", "sh", "-c", probe)
        assert out.split() == ["no-python", "0"]
    else:
        # The stand-in task: a clean git checkout whose test fails until the fix.
        script = "git status --porcelain; git log --format=%s; python3 -m unittest 2>&1; echo rc=$?"
        out = kubectl(cluster, "exec", "-n", namespace, "p", "--", "sh", "-c", script)
        assert out.startswith("calc: initial import\n"), out
        assert "FAILED (failures=1)" in out and out.rstrip().endswith("rc=1"), out


def test_first_pod_pulls_second_uses_cache(
    real_node: RealNode, core: CoreV1Api, namespace: str, images: dict[str, str]
) -> None:
    ref = images["tiny"]
    # Forget the image on the node so the next pod must pull it from the registry.
    if ref in _node_images(real_node):
        real_node.crictl("rmi", ref)
    assert ref not in _node_images(real_node)

    core.create_namespaced_pod(namespace, real_pod("first", ref, COMMANDS["tiny"]))
    wait_ready(core, namespace, "first")
    core.create_namespaced_pod(namespace, real_pod("second", ref, COMMANDS["tiny"]))
    wait_ready(core, namespace, "second")

    def reasons(name: str) -> list[tuple[str, str]]:
        return [(e["reason"], e["message"]) for e in events_for(core, namespace, name)]

    first = wait_for(
        lambda: reasons("first") if any(r == "Pulled" for r, _ in reasons("first")) else None,
        what="Pulled event of the first pod",
    )
    assert any(r == "Pulling" for r, _ in first), first
    assert any(r == "Pulled" and "Successfully pulled" in m for r, m in first), first

    second = wait_for(
        lambda: reasons("second") if any(r == "Pulled" for r, _ in reasons("second")) else None,
        what="Pulled event of the second pod",
    )
    assert not any(r == "Pulling" for r, _ in second), second
    assert any(r == "Pulled" and "already present on machine" in m for r, m in second), second
    assert ref in _node_images(real_node)


def _node_images(node: RealNode) -> set[str]:
    doc = json.loads(node.crictl("images", "-o", "json"))
    return {tag for img in doc.get("images", []) for tag in img.get("repoTags") or []}


def test_deleting_pod_removes_containers_and_netns(
    real_node: RealNode, core: CoreV1Api, namespace: str, images: dict[str, str]
) -> None:
    core.create_namespaced_pod(namespace, real_pod("gone", images["tiny"], COMMANDS["tiny"]))
    pod = wait_ready(core, namespace, "gone")
    uid = pod["metadata"]["uid"]
    sandboxes = real_node.crictl("pods", "-q", "--label", f"io.kubernetes.pod.uid={uid}").split()
    assert len(sandboxes) == 1
    info = json.loads(real_node.crictl("inspectp", sandboxes[0]))
    netns = next(
        ns["path"]
        for ns in info["info"]["runtimeSpec"]["linux"]["namespaces"]
        if ns["type"] == "network"
    )
    assert Path(netns).exists()
    containers = real_node.crictl("ps", "-a", "-q", "--pod", sandboxes[0]).split()
    assert containers

    core.delete_namespaced_pod("gone", namespace)

    def removed() -> bool:
        left = real_node.crictl("pods", "-q", "--label", f"io.kubernetes.pod.uid={uid}").split()
        ctrs = real_node.crictl("ps", "-a", "-q").split()
        return not left and not set(containers) & set(ctrs) and not Path(netns).exists()

    wait_for(removed, timeout=90, what="sandbox, containers and netns removed")
