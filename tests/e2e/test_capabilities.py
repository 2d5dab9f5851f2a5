"""No container of a sandbox holds CAP_NET_RAW on the real node (containerd).

Read where the kernel says it, in each kind of container of one sandbox: a
user's init container (its CapEff/CapBnd written to a shared emptyDir), the
app container (through the daemon's exec, as an agent would), and a debug
container added through the ``pods/ephemeralcontainers`` subresource with the
Kubernetes API, as ``kubectl debug`` does. The debug container shares the
sandbox's process namespace (``targetContainerName``), so it also reads the
daemon's own /proc/1/status. A debug container that does not drop NET_RAW
is refused by the webhook, naming the rule and the kubectl way out.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.contract import LABEL_SANDBOX
from sandman.harness.cluster.node import RealNode
from sandman.harness.kube import raw
from sandman.harness.testing import real_pod, wait_for, wait_ready
from tests.e2e.test_network_isolation import _run, _token

NET_RAW = 13  # capabilities(7): CAP_NET_RAW
CAPS = "grep -E '^Cap(Eff|Bnd):' /proc/self/status"
JSON_PATCH = "application/json-patch+json"


def _lacks_net_raw(where: str, text: str) -> None:
    lines = [line for line in text.splitlines() if line.startswith(("CapEff:", "CapBnd:"))]
    assert len(lines) == 2, f"{where}: {text!r}"
    for line in lines:
        field, value = line.split(":")
        assert not int(value.strip(), 16) & (1 << NET_RAW), f"{where}: {field} has NET_RAW: {line}"


def _sandbox(core: CoreV1Api, ns: str, image: str) -> dict[str, Any]:
    pod = real_pod("caps", image, ["sleep", "3600"])
    pod["metadata"]["labels"] = {LABEL_SANDBOX: "true"}
    spec = pod["spec"]
    spec["volumes"] = [{"name": "out", "emptyDir": {}}]
    spec["initContainers"] = [
        {
            "name": "setup",
            "image": image,
            "command": ["sh", "-c", f"{CAPS} > /out/init.txt"],
            "volumeMounts": [{"name": "out", "mountPath": "/out"}],
        }
    ]
    spec["containers"][0]["volumeMounts"] = [{"name": "out", "mountPath": "/out"}]
    core.create_namespaced_pod(ns, pod)
    return wait_ready(core, ns, "caps", timeout=180)


def _debug(core: CoreV1Api, ns: str, name: str, image: str, security: dict[str, Any] | None) -> Any:
    container: dict[str, Any] = {
        "name": name,
        "image": image,
        "targetContainerName": "main",
        "command": ["sh", "-c", f"{CAPS}; echo pid1; grep -E '^Cap(Eff|Bnd):' /proc/1/status"],
    }
    if security is not None:
        container["securityContext"] = security
    patch = [{"op": "add", "path": "/spec/ephemeralContainers/-", "value": container}]
    pod = raw(core.read_namespaced_pod("caps", ns, _preload_content=False))
    if not pod["spec"].get("ephemeralContainers"):
        patch = [{"op": "add", "path": "/spec/ephemeralContainers", "value": [container]}]
    return core.patch_namespaced_pod_ephemeralcontainers(
        "caps", ns, patch, _content_type=JSON_PATCH
    )


def test_no_container_kind_holds_net_raw_and_a_debug_container_must_drop_it(
    real_node: RealNode, core: CoreV1Api, namespace: str, images: dict[str, str]
) -> None:
    image = images["tiny"]
    pod = _sandbox(core, namespace, image)
    token = _token(core, namespace, pod)

    # App container: where the agent runs (the daemon's exec).
    app = _run(pod, token, CAPS)
    assert app["exit_code"] == 0, app
    _lacks_net_raw("app container", app["stdout"])
    # The user's init container, as it recorded itself.
    init = _run(pod, token, "cat /out/init.txt")
    assert init["exit_code"] == 0, init
    _lacks_net_raw("init container", init["stdout"])

    # kubectl debug's default (--profile=legacy: no securityContext) is refused.
    try:
        _debug(core, namespace, "plain", image, None)
    except ApiException as e:
        message = json.loads(e.body)["message"]
        assert e.status == 403, message
        assert "[capability-drop]" in message and "NET_RAW" in message, message
        assert "kubectl debug --profile=restricted" in message and "--custom" in message, message
    else:
        raise AssertionError("a debug container keeping NET_RAW was admitted")

    # Dropping NET_RAW (kubectl debug --custom) is admitted; inside, neither it
    # nor the daemon it shares a process namespace with holds NET_RAW.
    _debug(core, namespace, "dbg", image, {"capabilities": {"drop": ["NET_RAW"]}})

    def logs() -> str | None:
        p = raw(core.read_namespaced_pod("caps", namespace, _preload_content=False))
        for st in p["status"].get("ephemeralContainerStatuses") or []:
            if st["name"] == "dbg" and "terminated" in (st.get("state") or {}):
                return str(core.read_namespaced_pod_log("caps", namespace, container="dbg"))
        return None

    out = wait_for(logs, timeout=120, what="the debug container's output")
    own, _, target = out.partition("pid1")
    _lacks_net_raw("ephemeral container", own)
    _lacks_net_raw("the daemon, seen from the ephemeral container", target)
