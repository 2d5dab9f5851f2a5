"""A second wall: a policy requiring RuntimeClass gvisor puts sandboxes under gVisor.

On the real node (containerd's runtime handler ``runsc``): the webhook sets
``runtimeClassName: gvisor`` from the policy, the RuntimeClass admission adds
its overhead, the sandbox's own kernel is gVisor's (seen from inside), and
containerd ran the pod with runsc (seen from the host). A pod that names
another runtime class is refused by the policy. The rest of the daemon's
behaviour under gVisor is covered by the gvisor variants of test_sdk.py and
test_sandbox.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes.client import CoreV1Api, NodeV1Api
from kubernetes.client.exceptions import ApiException

from sandman.client import Sandbox, SandmanClient
from sandman.contract import LABEL_NODE_KIND, LABEL_SANDBOX
from sandman.harness.cluster import gvisor
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from tests.e2e.runtimes import GVISOR_RULE, RUNTIME_PROBE, assert_runs_under

REAL = {LABEL_NODE_KIND: "real"}


@pytest.fixture
async def sdk(cluster: LocalCluster, namespace: str) -> AsyncIterator[SandmanClient]:
    async with SandmanClient(kubeconfig=cluster.kubeconfig, namespace=namespace) as client:
        yield client


@pytest.mark.parametrize("runtime", ["gvisor"], indirect=True)
async def test_policy_puts_sandboxes_under_gvisor(
    real_node: RealNode,
    core: CoreV1Api,
    sdk: SandmanClient,
    namespace: str,
    images: dict[str, str],
    runtime: str,
) -> None:
    async with await Sandbox.create(
        sdk, images["tiny"], node_selector=REAL, command=["sleep", "3600"], ttl="20m"
    ) as sb:
        spec = sb.pod["spec"]
        assert spec["runtimeClassName"] == gvisor.RUNTIME_CLASS
        assert spec["overhead"] == gvisor.POD_OVERHEAD  # from the RuntimeClass
        assert spec["nodeName"] == real_node.node.name

        # Inside: gVisor's kernel answers, not the host's.
        probe = await sb.exec(RUNTIME_PROBE)
        assert probe.exit_code == 0, probe
        assert_runs_under("gvisor", probe.stdout)

        # Outside: containerd ran the pod sandbox with the runsc handler.
        (pod_id,) = real_node.crictl("pods", "-q", "--name", f"^{sb.name}$").split()
        info = json.loads(real_node.crictl("inspectp", pod_id))
        assert info["status"]["runtimeHandler"] == gvisor.HANDLER
        assert info["info"]["runtimeType"] == gvisor.RUNTIME_TYPE

    # The policy refuses a sandbox that asks for another runtime class (one
    # that exists: the RuntimeClass admission plugin refuses unknown ones itself).
    other = f"t-runc-{uuid.uuid4().hex[:6]}"
    node_api = NodeV1Api(core.api_client)
    node_api.create_runtime_class({"metadata": {"name": other}, "handler": "runc"})
    try:
        pod = {
            "metadata": {"name": "escape", "labels": {LABEL_SANDBOX: "true"}},
            "spec": {
                "runtimeClassName": other,
                "nodeSelector": REAL,
                "containers": [{"name": "main", "image": images["tiny"]}],
            },
        }
        with pytest.raises(ApiException) as e:
            core.create_namespaced_pod(namespace, pod)
    finally:
        node_api.delete_runtime_class(other)
    message = json.loads(e.value.body)["message"]
    assert e.value.status == 403 and f"'{GVISOR_RULE}'" in message, message
    assert "[runtime-class]" in message and "set spec.runtimeClassName: gvisor" in message
