"""Unmodified task images become sandboxes through the webhook, on the real node."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes.client import CoreV1Api

from sandman import tokens
from sandman.contract import LABEL_ID, LABEL_SANDBOX
from sandman.harness.cluster.node import RealNode
from sandman.harness.kube import raw
from sandman.harness.testing import wait_for, wait_ready
from tests.e2e.runtimes import RUNTIME_PROBE, assert_runs_under


def namespace_key(core: CoreV1Api, ns: str) -> bytes:
    # What a namespace user (or the SDK) does: read the access Secret by RBAC.
    def read() -> bytes | None:
        try:
            s = core.read_namespaced_secret(tokens.ACCESS_SECRET, ns)
        except Exception:
            return None
        return base64.b64decode(s.data[tokens.KEY_FIELD])

    return wait_for(read, timeout=30, what=f"{tokens.ACCESS_SECRET} in {ns}")


def call(ip: str, token: str, path: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"http://{ip}:7878{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize(
    ("image_name", "runtime"),
    [("tiny", "runc"), ("swe", "runc"), ("tiny", "gvisor")],
    indirect=["runtime"],
)
def test_labeled_pod_of_unmodified_image_runs_commands_with_its_token(
    real_node: RealNode,
    core: CoreV1Api,
    namespace: str,
    images: dict[str, str],
    image_name: str,
    runtime: str,
) -> None:
    pods = []
    for name in ("a", "b"):
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": name, "labels": {LABEL_SANDBOX: "true"}},
                "spec": {
                    "nodeSelector": {"sandman.dev/node-kind": "real"},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": images[image_name]}],
                },
            },
        )
    for name in ("a", "b"):
        pods.append(wait_ready(core, namespace, name, timeout=120))
    key = namespace_key(core, namespace)
    a, b = pods
    token_a = tokens.sandbox_token(key, a["metadata"]["labels"][LABEL_ID])
    token_b = tokens.sandbox_token(key, b["metadata"]["labels"][LABEL_ID])
    ip_a = a["status"]["podIP"]

    status, r = call(ip_a, token_a, "/v1/exec", {"cmd": "echo $((40+2)) from $(hostname)"})
    assert status == 200 and r["stdout"] == "42 from a\n", r
    status, r = call(ip_a, token_a, "/v1/exec", {"cmd": RUNTIME_PROBE})
    assert status == 200, r
    assert_runs_under(runtime, r["stdout"])
    if image_name == "swe":
        status, r = call(
            ip_a, token_a, "/v1/exec", {"cmd": ["python3", "-m", "unittest"], "cwd": "/work/repo"}
        )
        assert r["exit_code"] == 1 and "FAILED (failures=1)" in r["stderr"], r
    # Sandbox b's token, and anything else, is refused by sandbox a.
    for wrong in (token_b, "0" * 64, ""):
        status, r = call(ip_a, wrong, "/v1/exec", {"cmd": ["true"]})
        assert status == 401 and r["error"]["code"] == "unauthorized"
    # No service-account token inside, and the token hash is not in commands' env.
    status, r = call(
        ip_a, token_a, "/v1/exec", {"cmd": "ls /var/run/secrets/kubernetes.io 2>&1; env"}
    )
    assert "No such file" in r["stdout"] and "SANDMAN_TOKEN" not in r["stdout"]
    pod = raw(core.read_namespaced_pod("a", namespace, _preload_content=False))
    assert pod["spec"]["schedulerName"] == "sandman-scheduler"
    assert pod["spec"]["nodeName"] == real_node.node.name
