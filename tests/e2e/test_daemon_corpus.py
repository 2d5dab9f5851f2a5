"""The daemon API's hostile-input corpus against a daemon in a sandbox pod on
the real node: PID 1 of the Debian `swe` image under runc (the gVisor run,
with the busybox image, is tests/e2e/test_daemon_corpus_node.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from kubernetes.client import CoreV1Api

from sandman.client import Sandbox, SandmanClient
from sandman.contract import ANN_KEY_ID, DAEMON_DIR, DAEMON_PORT, annotations
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from tests.e2e.runtimes import RUNTIME_PROBE, assert_runs_under
from tests.unit.daemon import corpus

REAL = {"sandman.dev/node-kind": "real"}


@pytest.fixture
async def sdk(
    cluster: LocalCluster, namespace: str, real_node: RealNode
) -> AsyncIterator[SandmanClient]:
    async with SandmanClient(
        kubeconfig=cluster.kubeconfig, namespace=namespace, transport="direct"
    ) as client:
        yield client


@pytest.mark.parametrize("runtime", ["runc"], indirect=["runtime"])
async def test_every_corpus_case_holds_in_a_pod(
    core: CoreV1Api, sdk: SandmanClient, namespace: str, images: dict[str, str], runtime: str
) -> None:
    async with await Sandbox.create(
        sdk, images["swe"], node_selector=REAL, command=["sleep", "infinity"]
    ) as sb:
        assert_runs_under(runtime, (await sb.exec(RUNTIME_PROBE)).stdout)
        token = await sdk.token_for(sb.namespace, sb.id, annotations(sb.pod).get(ANN_KEY_ID))
        assert sb.ip is not None
        target = corpus.Target(sb.ip, DAEMON_PORT, token, DAEMON_DIR, "/tmp/sandman-corpus")
        results = await asyncio.to_thread(corpus.run_all, target)
        failed = {case: problems for case, problems in results.items() if problems}
        assert len(results) > 150
        assert failed == {}, "\n".join(f"{k}: {v}" for k, v in failed.items())
        log = core.read_namespaced_pod_log(sb.name, namespace, container="main")
        assert "Traceback" not in log, log[-3000:]
