"""The reaper on the real node: idleness seen through the daemon, and a missing image."""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman import tokens
from sandman.contract import ANN_IDLE_TIMEOUT, LABEL_ID, LABEL_SANDBOX
from sandman.harness.cluster import reaper as reaper_proc
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.kube import raw
from sandman.harness.probes import http_ok
from sandman.harness.testing import free_port, wait_for, wait_ready


@pytest.fixture
def reaper(cluster: LocalCluster, namespace: str, real_node: RealNode) -> Iterator[None]:
    # The cluster key lives in sandman-system (the webhook created it); the
    # reaper needs it to derive daemon tokens for its idle polls.
    port = free_port()
    extra = [f"--watch-namespace={namespace}", "--no-leader-elect", "--stuck-failing=5s"]
    proc = subprocess.Popen(
        reaper_proc.serve_argv(port, cluster.kubeconfig, extra=extra),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def ready() -> bool:
        try:
            return http_ok(reaper_proc.url(port, "/readyz"))
        except OSError:
            return False

    wait_for(ready, timeout=20, what="reaper ready")
    yield
    proc.terminate()
    proc.wait(10)


def _gone(core: CoreV1Api, ns: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, ns)
        return False
    except ApiException as e:
        return e.status == 404


def _events(core: CoreV1Api, ns: str, reason: str) -> list[dict[str, Any]]:
    items = raw(core.list_namespaced_event(ns, _preload_content=False))["items"]
    return [e for e in items if e["reason"] == reason]


def test_idle_sandbox_is_reclaimed_and_a_used_one_is_kept(
    core: CoreV1Api, namespace: str, images: dict[str, str], reaper: None
) -> None:
    for name in ("idle", "busy"):
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {
                    "name": name,
                    "labels": {LABEL_SANDBOX: "true"},
                    "annotations": {ANN_IDLE_TIMEOUT: "8s"},
                },
                "spec": {
                    "nodeSelector": {"sandman.dev/node-kind": "real"},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {"name": "main", "image": images["tiny"], "command": ["sleep", "3600"]}
                    ],
                },
            },
        )
    busy = wait_ready(core, namespace, "busy", timeout=120)
    wait_ready(core, namespace, "idle", timeout=120)
    key = base64.b64decode(
        core.read_namespaced_secret(tokens.ACCESS_SECRET, namespace).data[tokens.KEY_FIELD]
    )
    token = tokens.sandbox_token(key, busy["metadata"]["labels"][LABEL_ID])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not _gone(core, namespace, "idle"):
        # An agent using "busy" every 2 s: its daemon reports fresh activity.
        req = urllib.request.Request(
            f"http://{busy['status']['podIP']}:7878/v1/exec",
            data=json.dumps({"cmd": ["true"]}).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {token}"},
        )
        urllib.request.urlopen(req, timeout=5).read()
        time.sleep(2)
    assert _gone(core, namespace, "idle")
    assert not _gone(core, namespace, "busy")
    ev = _events(core, namespace, "IdleReclaimed")
    assert [e["involvedObject"]["name"] for e in ev] == ["idle"]


def test_missing_image_is_stuck_reclaimed(core: CoreV1Api, namespace: str, reaper: None) -> None:
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "no-image", "labels": {LABEL_SANDBOX: "true"}},
            "spec": {
                "nodeSelector": {"sandman.dev/node-kind": "real"},
                # A command, so admission does not look the (missing) image up:
                # the pull failure is what this test is about.
                "containers": [
                    {
                        "name": "main",
                        "image": "127.0.0.1:5000/sandman/does-not-exist:1",
                        "command": ["sleep", "3600"],
                    }
                ],
            },
        },
    )
    wait_for(lambda: _gone(core, namespace, "no-image"), timeout=60, what="stuck reclaim")
    ev = _events(core, namespace, "StuckReclaimed")
    assert ev and any(w in ev[0]["message"] for w in ("ErrImagePull", "ImagePullBackOff"))
