"""The real-node half of `sandman bench daemon`: daemon vs `kubectl exec`.

One pod of the `tiny` image runs the daemon the way injection does it (an
init container copies the executable from the `daemon` image into an
emptyDir at /.sandman; the container's command becomes `sandmand serve --
<original>`), and the same command (`true`) is timed through the daemon's
HTTP API from the host and through `kubectl exec`, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import secrets
import subprocess
import time
import uuid
from typing import Any

from kubernetes.client import CoreV1Api

from sandman.bench.daemon import exec_latencies
from sandman.bench.report import percentile
from sandman.cluster.kwok_nodes import NODE_KIND_LABEL
from sandman.images.build import ImageBuilder
from sandman.kube import api_client
from sandman.testing import bench_bed, wait_ready

DAEMON_PORT = 7878


def injected_pod(name: str, image: str, daemon_image: str, token_sha256: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {NODE_KIND_LABEL: "real"},
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": False,
            "volumes": [{"name": "sandman", "emptyDir": {}}],
            "initContainers": [
                {
                    "name": "sandman-install",
                    "image": daemon_image,
                    "command": ["/sandmand", "install", "/.sandman"],
                    "volumeMounts": [{"name": "sandman", "mountPath": "/.sandman"}],
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": [
                        "/.sandman/sandmand",
                        "serve",
                        f"--listen=0.0.0.0:{DAEMON_PORT}",
                        "--",
                        "httpd",
                        "-f",
                        "-p",
                        "8080",
                        "-h",
                        "/www",
                    ],
                    "env": [
                        {"name": "SANDMAN_TOKEN_SHA256", "value": token_sha256},
                        {"name": "TMPDIR", "value": "/.sandman"},
                    ],
                    "volumeMounts": [{"name": "sandman", "mountPath": "/.sandman"}],
                    "readinessProbe": {
                        "httpGet": {"path": "/healthz", "port": DAEMON_PORT},
                        "periodSeconds": 1,
                    },
                }
            ],
        },
    }


def node_comparison(args: argparse.Namespace, local: dict[str, Any]) -> dict[str, Any]:
    bed = bench_bed(need_real_node=True)
    try:
        cluster = bed.cluster
        node = cluster.real_node
        assert node is not None
        builder = ImageBuilder(cluster.config.cache_dir)
        tiny = builder.build_and_push("tiny", node.registry).ref
        daemon = builder.build_and_push("daemon", node.registry).ref
        core = CoreV1Api(api_client(cluster.kubeconfig))
        ns = f"bench-daemon-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": ns}})
        try:
            token = secrets.token_hex(16)
            digest = hashlib.sha256(token.encode()).hexdigest()
            core.create_namespaced_pod(ns, injected_pod("sandbox", tiny, daemon, digest))
            pod = wait_ready(core, ns, "sandbox", timeout=180)
            url = f"http://{pod['status']['podIP']}:{DAEMON_PORT}"
            daemon_lat = asyncio.run(exec_latencies(url, token, 500))
            kubectl = [
                str(cluster.binaries.kubectl),
                f"--kubeconfig={cluster.kubeconfig}",
                "-n",
                ns,
                "exec",
                "sandbox",
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
    node_p50 = percentile(daemon_lat, 50)
    kube_p50 = percentile(kube_lat, 50)
    return {
        "node_exec_p50_ms": node_p50,
        "node_exec_p99_ms": percentile(daemon_lat, 99),
        "kubectl_exec_p50_ms": kube_p50,
        "kubectl_exec_p99_ms": percentile(kube_lat, 99),
        "kubectl_vs_daemon_ratio": kube_p50 / node_p50,
    }
