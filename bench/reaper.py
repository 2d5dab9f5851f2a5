"""`sandman bench reaper`: reclaim latency at fleet scale, and zero wrong deletions.

N sandboxes on kwok nodes (bound directly with nodeName: the scheduler is not
what is measured) get leases ending uniformly over a window; a dedicated
reaper process (scoped to the bench namespace) reclaims them. A watch records
when each pod disappears; latency = disappearance - its expires-at annotation
(second precision, as the annotation has). Bystanders check safety: unlabeled
pods with leases long past, and sandboxes whose leases end after the run,
must all survive. API requests per reclaimed sandbox come from the reaper's
own request counters.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import datetime as dt
import json
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from typing import Any

from kubernetes import watch
from kubernetes.client import CoreV1Api

from sandman.bench.report import percentile, table
from sandman.contract import ANN_EXPIRES_AT, ANN_TTL, LABEL_SANDBOX
from sandman.harness.cluster.config import KwokNodeShape
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, KWOK_TOLERATION, kwok_node
from sandman.harness.kube import api_client
from sandman.harness.testing import bench_bed, free_port, wait_for


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sandboxes", type=int, default=10_000)
    p.add_argument(
        "--window", type=float, default=200.0, help="seconds over which leases end (uniformly)"
    )
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--bystanders", type=int, default=200)
    p.add_argument("--delete-qps", type=float, default=100.0)
    p.add_argument("--concurrency", type=int, default=32)


def _pod(name: str, node: str, ttl_s: int | None, labeled: bool) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "labels": {"bench": "reaper"}}
    if labeled:
        md["labels"][LABEL_SANDBOX] = "true"
        md["annotations"] = {ANN_TTL: f"{max(1, ttl_s or 1)}s"}
    else:
        md["annotations"] = {ANN_EXPIRES_AT: "2020-01-01T00:00:00Z"}
    return {
        "metadata": md,
        "spec": {
            "nodeName": node,
            "tolerations": [KWOK_TOLERATION],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": KWOK_IMAGE}],
        },
    }


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("sandman_reaper_") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    bed = bench_bed(need_real_node=False)
    cluster = bed.cluster
    core = CoreV1Api(api_client(cluster.kubeconfig))
    ns = f"bench-reaper-{uuid.uuid4().hex[:6]}"
    nodes = [f"bench-reaper-{ns[-6:]}-{i}" for i in range(args.nodes)]
    per_node = args.sandboxes // args.nodes + args.bystanders
    shape = KwokNodeShape(cpu="1000", memory="4Ti", pods=per_node + 100)
    reaper = None
    try:
        core.create_namespace({"metadata": {"name": ns}})
        for n in nodes:
            core.create_node(kwok_node(n, shape, labels={"bench": "reaper"}))
        gone_at: dict[str, float] = {}
        expires: dict[str, dt.datetime] = {}
        stop = threading.Event()
        w = watch.Watch()

        def watcher() -> None:
            # Resumes from the last resourceVersion whenever the stream breaks
            # (a long watch over 10k deletions will be cut at some point);
            # after a 410 it relists and counts what vanished meanwhile.
            rv = ""
            seen: set[str] = set()
            while not stop.is_set():
                try:
                    if not rv:
                        lst = core.list_namespaced_pod(ns, label_selector="bench=reaper")
                        names = {p.metadata.name for p in lst.items}
                        for gone in seen - names:
                            gone_at.setdefault(gone, time.time())
                        seen |= names
                        rv = lst.metadata.resource_version
                    for ev in w.stream(
                        core.list_namespaced_pod,
                        ns,
                        resource_version=rv,
                        label_selector="bench=reaper",
                        timeout_seconds=120,
                    ):
                        rv = ev["object"].metadata.resource_version
                        name = ev["object"].metadata.name
                        if ev["type"] == "DELETED":
                            gone_at.setdefault(name, time.time())
                        else:
                            seen.add(name)
                        if stop.is_set():
                            return
                except Exception as e:
                    if "410" in str(e) or "Expired" in str(e):
                        rv = ""
                    time.sleep(0.2)

        threading.Thread(target=watcher, daemon=True).start()
        time.sleep(0.5)
        # The reaper runs throughout, as in production. Sandboxes are created
        # with a long lease; then, in deadline order, each lease is moved to its
        # slot in [start, start + window]: patches outpace the deadlines, so no
        # lease ends before the reaper could know it.
        port = free_port()
        reaper = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sandman.reaper",
                "serve",
                f"--listen=127.0.0.1:{port}",
                f"--kubeconfig={cluster.kubeconfig}",
                f"--watch-namespace={ns}",
                "--no-leader-elect",
                f"--delete-qps={args.delete_qps}",
                "--workers=16",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        names = [f"sb-{i}" for i in range(args.sandboxes)]
        far = [(f"keep-{i}", nodes[i % len(nodes)]) for i in range(args.bystanders)]
        plain = [(f"plain-{i}", nodes[i % len(nodes)]) for i in range(args.bystanders)]
        t0 = time.time()
        with cf.ThreadPoolExecutor(args.concurrency) as pool:
            list(
                pool.map(
                    lambda i: core.create_namespaced_pod(
                        ns, _pod(names[i], nodes[i % len(nodes)], 3600, True)
                    ),
                    range(args.sandboxes),
                )
            )
            list(
                pool.map(
                    lambda it: core.create_namespaced_pod(ns, _pod(it[0], it[1], 6 * 3600, True)),
                    far,
                )
            )
            list(
                pool.map(
                    lambda it: core.create_namespaced_pod(ns, _pod(it[0], it[1], None, False)),
                    plain,
                )
            )
        created_in = time.time() - t0
        start = time.time() + 20
        plan = [(n, start + args.window * i / args.sandboxes) for i, n in enumerate(names)]

        def set_lease(item: tuple[str, float]) -> None:
            name, end = item
            when = dt.datetime.fromtimestamp(int(end) + 1, dt.UTC)  # second precision
            expires[name] = when
            core.patch_namespaced_pod(
                name,
                ns,
                {
                    "metadata": {
                        "annotations": {ANN_EXPIRES_AT: when.strftime("%Y-%m-%dT%H:%M:%SZ")}
                    }
                },
            )

        with cf.ThreadPoolExecutor(8) as pool:
            list(pool.map(set_lease, plan))
        last = max(e for _, e in plan)
        wait_for(
            lambda: len([n for n in list(gone_at) if n.startswith("sb-")]) >= args.sandboxes,
            timeout=max(60.0, last - time.time() + 120),
            what="every sandbox reclaimed",
        )
        time.sleep(2)
        m = _metrics(port)
        stop.set()
    finally:
        if reaper is not None:
            reaper.terminate()
            try:
                reaper.wait(15)
            except subprocess.TimeoutExpired:
                reaper.kill()
                reaper.wait()
        core.delete_namespace(ns)
        for n in nodes:
            with contextlib.suppress(Exception):
                core.delete_node(n)
        bed.close()
    lat = [gone_at[n] - expires[n].timestamp() for n in expires if n in gone_at]
    wrong = [n for n in gone_at if n.startswith(("keep-", "plain-"))]
    early = [n for n in expires if n in gone_at and gone_at[n] < expires[n].timestamp() - 1]
    requests = sum(
        v
        for k, v in m.items()
        if k.startswith("sandman_reaper_api_requests{") and 'verb="WATCH"' not in k
    )
    results = {
        "sandboxes": args.sandboxes,
        "window_s": args.window,
        "created_in_s": created_in,
        "reclaim_p50_s": percentile(lat, 50),
        "reclaim_p99_s": percentile(lat, 99),
        "reclaim_max_s": max(lat) if lat else float("nan"),
        "wrong_deletions": len(wrong) + len(early),
        "api_requests_per_reclaim": requests / max(1, len(lat)),
        "throttled": m.get("sandman_reaper_deletes_throttled_total", 0.0),
        # The reaper's own view (delete time - deadline), to tell its lag from
        # the observing watch's.
        "reaper_mean_latency_s": m.get(
            'sandman_reaper_reclaim_latency_seconds_sum{reason="LeaseExpired"}', 0.0
        )
        / max(
            1.0, m.get('sandman_reaper_reclaim_latency_seconds_count{reason="LeaseExpired"}', 0.0)
        ),
        "delete_qps": args.delete_qps,
    }
    print(table("reaper", list(results.items())))
    print(json.dumps({"late_over_2s": sum(1 for x in lat if x > 2)}))
    return results
