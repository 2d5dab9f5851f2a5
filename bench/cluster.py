"""`sandman bench cluster`: how fast the local cluster starts and runs pods.

A fresh private cluster (its own state dir and ports, cached binaries) is
brought up and timed, then N pods are created at a fixed client concurrency
and timed until all are Running on kwok nodes, then the cluster is stopped.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import watch
from kubernetes.client import CoreV1Api

from sandman.bench.report import percentile, table
from sandman.harness.cluster import running
from sandman.harness.cluster.config import ClusterConfig, Ports
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import api_client


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pods", type=int, default=300)
    p.add_argument("--kwok-nodes", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)


def run(args: argparse.Namespace) -> dict[str, Any]:
    running.check_may_start_cluster()  # another cluster's load would be measured too
    with tempfile.TemporaryDirectory(prefix="sandman-bench-cluster-") as tmp:
        cfg = dataclasses.replace(
            ClusterConfig(state_dir=Path(tmp) / "state"),
            ports=Ports.free(),
            kwok_nodes=args.kwok_nodes,
        )
        cluster = LocalCluster(cfg)
        t0 = time.monotonic()
        try:
            cluster.up()
            up_s = time.monotonic() - t0
            pods = _create_and_wait(cluster, args.pods, args.concurrency)
        finally:
            t1 = time.monotonic()
            cluster.down(purge=True)
            down_s = time.monotonic() - t1
    results = {"up_s": up_s, "down_s": down_s, "kwok_nodes": args.kwok_nodes, **pods}
    print(table("local cluster", list(results.items())))
    return results


def _create_and_wait(cluster: LocalCluster, n: int, concurrency: int) -> dict[str, Any]:
    core = CoreV1Api(api_client(cluster.kubeconfig))
    ns = "bench-cluster"
    core.create_namespace({"metadata": {"name": ns}})
    running_at: dict[str, float] = {}
    done = threading.Event()
    w = watch.Watch()

    def watcher() -> None:
        for ev in w.stream(core.list_namespaced_pod, ns, timeout_seconds=600):
            pod = ev["object"]
            if pod.status and pod.status.phase == "Running":
                running_at.setdefault(pod.metadata.name, time.monotonic())
                if len(running_at) >= n:
                    done.set()
                    w.stop()

    th = threading.Thread(target=watcher, daemon=True)
    th.start()
    time.sleep(0.5)  # let the watch open before the first create
    created_at: dict[str, float] = {}

    def create(i: int) -> None:
        name = f"p-{i}"
        created_at[name] = time.monotonic()
        core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": name},
                "spec": on_kwok({"containers": [{"name": "c", "image": KWOK_IMAGE}]}),
            },
        )

    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(create, range(n)))
    create_s = time.monotonic() - t0
    done.wait(600)
    all_running_s = time.monotonic() - t0
    lat = [running_at[k] - created_at[k] for k in running_at if k in created_at]
    return {
        "pods": n,
        "create_s": create_s,
        "create_per_s": n / create_s,
        "all_running_s": all_running_s,
        "running": len(running_at),
        "create_to_running_p50_s": percentile(lat, 50),
        "create_to_running_p99_s": percentile(lat, 99),
    }
