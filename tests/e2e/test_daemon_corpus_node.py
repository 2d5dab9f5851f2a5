"""The daemon API's hostile-input corpus (tests/corpus/daemon) against a sandbox
on the real node, under gVisor: the daemon in gVisor's kernel (its own
network stack, file system and process model) holds every case as the host
daemon does in tests/unit/daemon/test_corpus.py, and never logs a traceback.
(The runc run, with the Debian image, is tests/e2e/test_daemon_corpus.py.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from kubernetes.client import CoreV1Api

from sandman.client import Sandbox, SandmanClient
from sandman.contract import ANN_KEY_ID, DAEMON_DIR, DAEMON_PORT, LABEL_NODE_KIND, annotations
from sandman.harness.cluster.local import LocalCluster
from tests.e2e.runtimes import RUNTIME_PROBE, assert_runs_under
from tests.unit.daemon import corpus

REAL = {LABEL_NODE_KIND: "real"}
# The runner fails a case that takes longer than its read timeout (30 s), a
# hang detector. Under gVisor every process start goes through the Sentry:
# the cap case (257 background processes) took over 30 s here while other
# sessions loaded the machine (the whole corpus: 19 s idle, 68 s loaded). A
# hang still fails, after this long.
GVISOR_READ_TIMEOUT_S = 120.0


@pytest.fixture
async def sdk(cluster: LocalCluster, namespace: str) -> AsyncIterator[SandmanClient]:
    async with SandmanClient(kubeconfig=cluster.kubeconfig, namespace=namespace) as client:
        yield client


@pytest.mark.parametrize("runtime", ["gvisor"], indirect=True)
async def test_daemon_corpus_holds_in_a_sandbox(
    monkeypatch: pytest.MonkeyPatch,
    core: CoreV1Api,
    sdk: SandmanClient,
    namespace: str,
    images: dict[str, str],
    runtime: str,
) -> None:
    # busybox has what the corpus's setup steps run (sh, ln, mkfifo).
    async with await Sandbox.create(
        sdk, images["tiny"], node_selector=REAL, command=["sleep", "3600"], ttl="20m"
    ) as sb:
        assert_runs_under(runtime, (await sb.exec(RUNTIME_PROBE)).stdout)
        assert sb.ip is not None
        token = await sdk.token_for(sb.namespace, sb.id, annotations(sb.pod).get(ANN_KEY_ID))
        target = corpus.Target(sb.ip, DAEMON_PORT, token, DAEMON_DIR)
        monkeypatch.setattr(corpus, "READ_TIMEOUT_S", GVISOR_READ_TIMEOUT_S)
        results = await asyncio.to_thread(corpus.run_all, target)
        failed = {case: problems for case, problems in results.items() if problems}
        assert len(results) >= len(list(corpus.load()))
        assert failed == {}, "\n".join(f"{c}: {'; '.join(p)}" for c, p in failed.items())
        log = core.read_namespaced_pod_log(sb.name, namespace, container="main")
        assert "Traceback" not in log, log[-3000:]
