"""The real-node half of `sandman bench daemon`: daemon and SDK vs `kubectl exec`.

One sandbox of the `tiny` image is created the way users do (a labeled pod;
the webhook injects the daemon), and the same command (`true`) is timed, in
the same run, three ways: raw HTTP to the daemon from the host, the SDK's
`Sandbox.exec` over its direct transport, and `kubectl exec`.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time
import uuid
from typing import Any

from kubernetes.client import CoreV1Api

from sandman.bench.daemon import exec_latencies
from sandman.bench.report import percentile
from sandman.client import Sandbox, SandmanClient
from sandman.harness.cluster.kwok_nodes import NODE_KIND_LABEL
from sandman.harness.images.build import ImageBuilder
from sandman.harness.kube import api_client
from sandman.harness.testing import bench_bed

SDK_EXECS = 500


async def _sdk_and_http(kubeconfig: str, ns: str, image: str) -> dict[str, Any]:
    async with SandmanClient(kubeconfig=kubeconfig, namespace=ns, transport="direct") as c:
        sb = await Sandbox.create(
            c, image, node_selector={NODE_KIND_LABEL: "real"}, command=["sleep", "3600"], ttl="30m"
        )
        token = await c.token_for(sb.namespace, sb.id)
        http = await exec_latencies(f"http://{sb.ip}:7878", token, SDK_EXECS)
        sdk = []
        for _ in range(20):  # warm the pool
            await sb.exec(["true"])
        for _ in range(SDK_EXECS):
            t = time.perf_counter()
            r = await sb.exec(["true"])
            sdk.append((time.perf_counter() - t) * 1000)
            assert r.exit_code == 0
        return {"name": sb.name, "http": http, "sdk": sdk, "ttfc_s": sb.timings.phases()["ttfc_s"]}


def node_comparison(args: argparse.Namespace, local: dict[str, Any]) -> dict[str, Any]:
    bed = bench_bed(need_real_node=True)
    try:
        cluster = bed.cluster
        node = cluster.real_node
        assert node is not None
        tiny = ImageBuilder(cluster.config.cache_dir).build_and_push("tiny", node.registry).ref
        core = CoreV1Api(api_client(cluster.kubeconfig))
        ns = f"bench-daemon-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": ns}})
        try:
            got = asyncio.run(_sdk_and_http(str(cluster.kubeconfig), ns, tiny))
            kubectl = [
                str(cluster.binaries.kubectl),
                f"--kubeconfig={cluster.kubeconfig}",
                "-n",
                ns,
                "exec",
                got["name"],
                "-c",
                "main",
                "--",
                "true",
            ]
            subprocess.run(kubectl, check=True, capture_output=True, timeout=60)  # warm
            kube_lat = []
            for _ in range(args.kubectl_execs):
                t = time.perf_counter()
                subprocess.run(kubectl, check=True, capture_output=True, timeout=60)
                kube_lat.append((time.perf_counter() - t) * 1000)
        finally:
            core.delete_namespace(ns)
    finally:
        bed.close()
    node_p50 = percentile(got["http"], 50)
    sdk_p50 = percentile(got["sdk"], 50)
    kube_p50 = percentile(kube_lat, 50)
    return {
        "node_exec_p50_ms": node_p50,
        "node_exec_p99_ms": percentile(got["http"], 99),
        "sdk_exec_p50_ms": sdk_p50,
        "sdk_exec_p99_ms": percentile(got["sdk"], 99),
        "kubectl_exec_p50_ms": kube_p50,
        "kubectl_exec_p99_ms": percentile(kube_lat, 99),
        "kubectl_vs_daemon_ratio": kube_p50 / node_p50,
        "sdk_vs_kubectl_exec_ratio": kube_p50 / sdk_p50,
        "sandbox_ttfc_s": got["ttfc_s"],
    }
