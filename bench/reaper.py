"""`sandman bench reaper`: reclaim latency at fleet scale, and zero wrong deletions.

N sandboxes on kwok nodes (bound directly with nodeName: the scheduler is not
what is measured) get leases ending uniformly over a window; a dedicated
reaper process (scoped to the bench namespace) reclaims them. A watch records
when each pod disappears; latency = disappearance - its expires-at annotation
(second precision, as the annotation has). Bystanders check safety: unlabeled
pods with leases long past, and sandboxes whose leases end after the run,
must all survive. API requests per reclaimed sandbox come from the reaper's
own request counters.

A cluster that runs Sandman's own reaper (`make up`: the sandman-reaper
Deployment, leader-elected, watching every namespace) would race the bench's:
each reclaims part of the sandboxes and counts only its part, so the bench's
reaper never counts them all and its latencies are half someone else's. That
reaper is paused for the run (scaled to 0, or its host process stopped) and
brought back afterwards.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import datetime as dt
import json
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import watch
from kubernetes.client import AppsV1Api, CoreV1Api

from sandman.bench.report import percentile, table
from sandman.contract import ANN_EXPIRES_AT, ANN_TTL, LABEL_SANDBOX, NAMESPACE
from sandman.harness.cluster import reaper as reaper_proc
from sandman.harness.cluster.config import ClusterConfig, KwokNodeShape
from sandman.harness.cluster.incluster import REAPER
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, KWOK_TOLERATION, kwok_node
from sandman.harness.cluster.local import LocalCluster
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
    p.add_argument("--workers", type=int, default=None,
                   help="the reaper's --workers (default: the reaper's own)")  # fmt: skip


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
    with urllib.request.urlopen(reaper_proc.url(port, "/metrics"), timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("sandman_reaper_") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


class DeletionWatch:
    """Records when each bench pod disappears, from a watch in a thread.

    Resumes from the last resourceVersion whenever the stream breaks (a long
    watch over 10k deletions will be cut at some point); after a 410 it
    relists and counts what vanished meanwhile. ``listed`` is set once the
    first list is in, so nothing created afterwards can be missed.
    """

    def __init__(self, core: CoreV1Api, ns: str) -> None:
        self.core, self.ns = core, ns
        self.gone_at: dict[str, float] = {}
        self.listed = threading.Event()
        self.stop = threading.Event()
        self._watch = watch.Watch()

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def gone(self, prefix: str) -> int:
        return sum(1 for n in list(self.gone_at) if n.startswith(prefix))

    def _run(self) -> None:
        rv = ""
        seen: set[str] = set()
        while not self.stop.is_set():
            try:
                if not rv:
                    lst = self.core.list_namespaced_pod(self.ns, label_selector="bench=reaper")
                    names = {p.metadata.name for p in lst.items}
                    for gone in seen - names:
                        self.gone_at.setdefault(gone, time.time())
                    seen |= names
                    rv = lst.metadata.resource_version
                    self.listed.set()
                for ev in self._watch.stream(
                    self.core.list_namespaced_pod,
                    self.ns,
                    resource_version=rv,
                    label_selector="bench=reaper",
                    timeout_seconds=120,
                ):
                    rv = ev["object"].metadata.resource_version
                    name = ev["object"].metadata.name
                    if ev["type"] == "DELETED":
                        self.gone_at.setdefault(name, time.time())
                    else:
                        seen.add(name)
                    if self.stop.is_set():
                        return
            except Exception as e:
                if "410" in str(e) or "Expired" in str(e):
                    rv = ""
                time.sleep(0.2)


def _start_reaper(
    kubeconfig: Path, ns: str, port: int, delete_qps: float, workers: int | None, log: Path
) -> subprocess.Popen:
    # --extension-grace=0: a host process cannot resolve an in-cluster
    # webhook's Service, would take the webhook for down and hold every lease.
    extra = [
        f"--watch-namespace={ns}",
        "--no-leader-elect",
        f"--delete-qps={delete_qps}",
        "--extension-grace=0",
    ]
    if workers is not None:
        extra.append(f"--workers={workers}")
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            reaper_proc.serve_argv(port, kubeconfig, extra=extra),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def competing_reaper(config: ClusterConfig) -> str | None:
    """How the cluster runs a reaper of its own that also reclaims the bench's
    sandboxes ("in-cluster", "host"), or None. Test clusters run none."""
    if not config.deploy_reaper:
        return None
    return config.sandman_mode


# Seconds for the deployed reaper's pods to go away when scaled to 0 (their
# grace period is the default 30 s).
PAUSE_TIMEOUT_S = 90.0


@contextlib.contextmanager
def cluster_reaper_paused(cluster: LocalCluster) -> Iterator[None]:
    """The cluster's own reaper stopped for the block: the bench measures its
    reaper alone (two reapers split the reclaims, and each counts its part)."""
    mode = competing_reaper(cluster.config)
    if mode is None:
        yield
        return
    print(f"pausing the cluster's {mode} reaper for the run", flush=True)
    if mode == "host":
        procs = [p for p in cluster.processes() if p.name == REAPER]
        for proc in procs:
            proc.stop()
        try:
            yield
        finally:
            for proc in procs:
                proc.start()
        return
    apps = AppsV1Api(api_client(cluster.kubeconfig))
    core = CoreV1Api(api_client(cluster.kubeconfig))
    replicas = apps.read_namespaced_deployment_scale(REAPER, NAMESPACE).spec.replicas
    apps.patch_namespaced_deployment_scale(REAPER, NAMESPACE, {"spec": {"replicas": 0}})
    try:
        wait_for(
            lambda: (
                not core.list_namespaced_pod(
                    NAMESPACE, label_selector=f"app.kubernetes.io/name={REAPER}"
                ).items
            ),
            timeout=PAUSE_TIMEOUT_S,
            what=f"{NAMESPACE}/{REAPER} scaled to 0",
        )
        yield
    finally:
        apps.patch_namespaced_deployment_scale(REAPER, NAMESPACE, {"spec": {"replicas": replicas}})


def _stop_reaper(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _create_pods(core: CoreV1Api, ns: str, nodes: list[str], args: argparse.Namespace) -> list[str]:
    """The sandboxes (a long lease for now) and both kinds of bystanders."""
    names = [f"sb-{i}" for i in range(args.sandboxes)]
    far = [(f"keep-{i}", nodes[i % len(nodes)]) for i in range(args.bystanders)]
    plain = [(f"plain-{i}", nodes[i % len(nodes)]) for i in range(args.bystanders)]
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
    return names


def _set_leases(
    core: CoreV1Api, ns: str, names: list[str], window: float
) -> dict[str, dt.datetime]:
    """Move each lease, in deadline order, to its slot in [start, start + window]:
    patches outpace the deadlines, so no lease ends before the reaper could know it."""
    start = time.time() + 20
    plan = [(n, start + window * i / len(names)) for i, n in enumerate(names)]
    expires: dict[str, dt.datetime] = {}

    def set_lease(item: tuple[str, float]) -> None:
        name, end = item
        when = dt.datetime.fromtimestamp(int(end) + 1, dt.UTC)  # second precision
        expires[name] = when
        patch = {"metadata": {"annotations": {ANN_EXPIRES_AT: when.strftime("%Y-%m-%dT%H:%M:%SZ")}}}
        core.patch_namespaced_pod(name, ns, patch)

    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(set_lease, plan))
    return expires


def _counted(port: int, sandboxes: int) -> dict[str, float] | None:
    """The reaper's metrics once it has counted every reclaim (the watch may see
    a deletion before the reaper's delete call has returned)."""
    m = _metrics(port)
    reclaimed = sum(
        v
        for k, v in m.items()
        if k.startswith("sandman_reaper_reclaimed_total{") and 'dry_run="false"' in k
    )
    return m if reclaimed >= sandboxes else None


def _latencies(gone_at: dict[str, float], expires: dict[str, dt.datetime]) -> list[float]:
    return [gone_at[n] - expires[n].timestamp() for n in expires if n in gone_at]


def summarize(
    args: argparse.Namespace,
    gone_at: dict[str, float],
    expires: dict[str, dt.datetime],
    m: dict[str, float],
    created_in: float,
) -> dict[str, Any]:
    lat = _latencies(gone_at, expires)
    wrong = [n for n in gone_at if n.startswith(("keep-", "plain-"))]
    early = [n for n in expires if n in gone_at and gone_at[n] < expires[n].timestamp() - 1]
    requests = sum(
        v
        for k, v in m.items()
        if k.startswith("sandman_reaper_api_requests_total{") and 'verb="WATCH"' not in k
    )
    return {
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    bed = bench_bed(need_real_node=False)
    cluster = bed.cluster
    core = CoreV1Api(api_client(cluster.kubeconfig))
    ns = f"bench-reaper-{uuid.uuid4().hex[:6]}"
    nodes = [f"bench-reaper-{ns[-6:]}-{i}" for i in range(args.nodes)]
    per_node = args.sandboxes // args.nodes + args.bystanders
    shape = KwokNodeShape(cpu="1000", memory="4Ti", pods=per_node + 100)
    reaper = None
    deletions = DeletionWatch(core, ns)
    paused = contextlib.ExitStack()
    try:
        paused.enter_context(cluster_reaper_paused(cluster))
        core.create_namespace({"metadata": {"name": ns}})
        for n in nodes:
            core.create_node(kwok_node(n, shape, labels={"bench": "reaper"}))
        deletions.start()
        deletions.listed.wait(60)
        # The reaper runs throughout, as in production.
        port = free_port()
        log = Path(tempfile.gettempdir()) / f"{ns}-reaper.log"
        print(f"reaper log: {log}, metrics: {reaper_proc.url(port, '/metrics')}", flush=True)
        reaper = _start_reaper(cluster.kubeconfig, ns, port, args.delete_qps, args.workers, log)
        t0 = time.time()
        names = _create_pods(core, ns, nodes, args)
        created_in = time.time() - t0
        expires = _set_leases(core, ns, names, args.window)
        last = max(e.timestamp() for e in expires.values())
        wait_for(
            lambda: deletions.gone("sb-") >= args.sandboxes,
            # The last lease's end, the delete budget's time for all of them,
            # and margin: a loaded machine reclaims late, it is not a failure.
            timeout=max(60.0, last - time.time() + 120 + args.sandboxes / args.delete_qps),
            what="every sandbox reclaimed",
        )
        m = wait_for(lambda: _counted(port, args.sandboxes), timeout=30, what="reaper metrics")
    finally:
        deletions.stop.set()
        if reaper is not None:
            _stop_reaper(reaper)
        core.delete_namespace(ns)
        for n in nodes:
            with contextlib.suppress(Exception):
                core.delete_node(n)
        paused.close()
        bed.close()
    results = summarize(args, deletions.gone_at, expires, m, created_in)
    late = sum(1 for x in _latencies(deletions.gone_at, expires) if x > 2)
    print(table("reaper", list(results.items())))
    print(json.dumps({"late_over_2s": late}))
    return results
