"""`sandman bench extender`: what the extender costs, and what it saves.

1. /prioritize latency: an extender process serving a synthetic index of
   5,000 nodes and 10,000 tracked images, asked sequentially (as the scheduler
   does) for realistic sandbox pods with 1,000 and 5,000 candidate nodes over
   loopback HTTP; p50/p99 as the client sees them.
2. Placement study, both variants in one run on the same workload: the RL
   batch (500 task images x 4 rollouts, at most 64 sandboxes at once) on 10
   simulated nodes with limited image disk. A real kube-scheduler decides every
   placement: once with a plain profile (what the default scheduler does), once
   with the extender. Pulls are not performed but modeled from the decisions
   (model below); the bench plays the kubelets, so the schedulers and the
   extender see the modeled world: node.status.images lists what the modeled
   disk holds, and a pod stays bound-but-not-started for exactly its modeled
   pull.

Model assumptions (also reported in the JSON):
- Each node pulls one image at a time, FIFO (kubelet default
  serializeImagePulls: true), at --pull-mbps MB/s including unpacking
  (16 MB/s default: 1.2 GB took 74.9 s more cold than warm on GKE).
- Layers are not shared between task images; a pull fetches the whole image.
- A pod whose image is on disk starts --start-s after placement; one whose
  image is being pulled there starts when that pull ends (shared fetch).
- Image disk holds --disk-gb per node; completing a pull evicts least recently
  used images no running sandbox uses (kubelet image GC, made immediate); if
  every image is in use the disk overflows (counted).
- A sandbox runs --run-s after its first command, then is deleted; the next
  queued sandbox is created at once (concurrency limit). Rollouts of one
  problem are queued together; problems in order.
- TTFC = modeled time from creation to start (scheduling itself is ms and
  left out of the model).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gc
import hashlib
import heapq
import http.client
import itertools
import json
import multiprocessing as mp
import random
import socket
import ssl
import tempfile
import time
import uuid
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandman.bench.report import percentile, table
from sandman.contract import ANN_INJECTED, ANN_TTL, LABEL_BENCH, LABEL_ID, LABEL_SANDBOX
from sandman.extender.config import ExtenderConfig
from sandman.extender.index import ImageIndex
from sandman.extender.observe import ContainerImage, ImageEntry, NodeReport, PodReport
from sandman.harness.cluster.extender import (
    extender_process,
    extender_spec,
    ready_url,
    scheduler_process,
)
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.testing import bench_bed, free_port
from sandman.informer import Informer
from sandman.kube_async import (
    MERGE_PATCH,
    NAMESPACES,
    NODES,
    PODS,
    ApiError,
    KubeClient,
    Resource,
    sleep_or,
)

GB = 10**9
LEASES = Resource("coordination.k8s.io", "v1", "leases")
LABEL = LABEL_BENCH + "-extender"
DAEMON = "127.0.0.1:5000/sandman/daemon:bench"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--images", type=int, default=500, help="task images (problems)")
    p.add_argument("--rollouts", type=int, default=4, help="sandboxes per image")
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=64, help="sandboxes alive at once")
    p.add_argument("--disk-gb", type=float, default=40.0, help="image disk per node")
    p.add_argument("--pull-mbps", type=float, default=16.0, help="pull+unpack MB/s per node")
    p.add_argument("--image-gb", type=float, nargs=2, default=(1.0, 3.0), metavar=("MIN", "MAX"))
    p.add_argument("--run-s", type=float, default=120.0, help="modeled sandbox run time")
    p.add_argument("--start-s", type=float, default=2.0, help="modeled start with image present")
    p.add_argument("--settle-ms", type=float, default=20.0, help="watch catch-up per batch")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--latency-requests", type=int, default=400)
    p.add_argument("--tracked-images", type=int, default=10_000)
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--skip-placement", action="store_true")


# -- 1. latency ------------------------------------------------------------------
def synthetic_index(nodes: int, images: int, seed: int) -> ImageIndex:
    """50 images per node (the kubelet's list), each image on ~nodes*50/images nodes,
    the daemon everywhere, one running and some pending pods per node."""
    rng = random.Random(seed)
    ix = ImageIndex(clock=time.monotonic)
    refs = [f"127.0.0.1:5000/bench/task-{k:05d}:v1" for k in range(images)]
    sizes = [rng.randint(GB, 3 * GB) for _ in refs]
    for n in range(nodes):
        picks = sorted(rng.sample(range(images), 49), key=lambda k: -sizes[k])
        entries = [ImageEntry((refs[k],), sizes[k]) for k in picks]
        entries.append(ImageEntry((DAEMON,), 20_000_000))
        ix.update_node(NodeReport(f"node-{n:05d}", tuple(entries)))
        run = ContainerImage(refs[picks[0]], "started")
        ix.update_pod(PodReport(f"run-{n}", f"node-{n:05d}", (run,)))
        if n % 10 == 0:
            pend = ContainerImage(refs[rng.randrange(images)], "pending")
            ix.update_pod(PodReport(f"pend-{n}", f"node-{n:05d}", (pend,)))
    return ix


def _serve_synthetic(port: int, nodes: int, images: int, seed: int) -> None:
    from aiohttp import web

    from sandman.extender.server import create_app

    ix = synthetic_index(nodes, images, seed)
    gc.collect()
    gc.freeze()  # as the real server does once its watches have listed
    app = create_app(ExtenderConfig(watch=False), None, index=ix)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _sandbox_pod(uid: str, image: str) -> dict[str, Any]:
    """What the scheduler sends: a webhook-injected sandbox pod, status included."""
    return {
        "metadata": {
            "name": f"rollout-{uid}",
            "namespace": "rl",
            "uid": uid,
            "labels": {LABEL_SANDBOX: "true", LABEL_ID: uid},
            "annotations": {ANN_TTL: "90m", ANN_INJECTED: "0.1.0"},
        },
        "spec": {
            "schedulerName": "sandman-scheduler",
            "initContainers": [{"name": "sandman-init", "image": DAEMON}],
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": ["/.sandman/sandmand"],
                    "env": [{"name": "TASK", "value": image}],
                    "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
                }
            ],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}],
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def _latencies(port: int, node_names: list[str], images: int, n: int) -> list[float]:
    """Sequential calls on one keep-alive connection, timed from sending the
    encoded body to the last byte of the answer. A plain blocking client: the
    scheduler's (Go) encoding and decoding are not ours to count."""
    rng = random.Random(7)
    out: list[float] = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Content-Type": "application/json"}
    try:
        for i in range(n + 50):
            image = f"127.0.0.1:5000/bench/task-{rng.randrange(images):05d}:v1"
            args = {"Pod": _sandbox_pod(uuid.uuid4().hex, image), "NodeNames": node_names}
            body = json.dumps(args).encode()
            t = time.perf_counter()
            conn.request("POST", "/prioritize", body=body, headers=headers)
            resp = conn.getresponse()
            answer = resp.read()
            if i >= 50:  # the first ones warm up connections and caches
                out.append((time.perf_counter() - t) * 1000)
            assert resp.status == 200 and len(json.loads(answer)) == len(node_names)
    finally:
        conn.close()
    return out


def latency_study(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    proc = mp.get_context("spawn").Process(
        target=_serve_synthetic, args=(port, 5000, args.tracked_images, args.seed), daemon=True
    )
    proc.start()
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or not proc.is_alive():
                    raise RuntimeError("the synthetic extender did not start") from None
                time.sleep(0.2)
        names = [f"node-{n:05d}" for n in range(5000)]
        out: dict[str, Any] = {}
        for label, count in (("1k", 1000), ("5k", 5000)):
            lat = _latencies(port, names[:count], args.tracked_images, args.latency_requests)
            out[f"prioritize_p50_ms_{label}"] = percentile(lat, 50)
            out[f"prioritize_p99_ms_{label}"] = percentile(lat, 99)
        out["latency_tracked_images"] = args.tracked_images
        out["latency_index_nodes"] = 5000
        return out
    finally:
        proc.terminate()
        proc.join(10)


# -- 2. placement ----------------------------------------------------------------
@dataclass
class Sandbox:
    idx: int
    image: str
    size: int
    arrival: float
    pod: str = ""
    node: str = ""
    ready: float = 0.0
    waited_for_pull: bool = False


@dataclass
class SimNode:
    disk: OrderedDict[str, int] = field(default_factory=OrderedDict)  # LRU, pulled images
    in_use: Counter[str] = field(default_factory=Counter)
    pulling: dict[str, float] = field(default_factory=dict)  # image -> modeled finish
    free_at: float = 0.0  # when its (serial) puller is free
    pulls: int = 0
    bytes_pulled: int = 0
    evictions: int = 0
    overflows: int = 0


class PullModel:
    """The modeled nodes: serialized pulls, LRU disk (see the module docstring).

    Pure bookkeeping; the driver turns its results into API writes. Not
    thread-safe (one event loop).
    """

    def __init__(self, nodes: list[str], disk: float, bandwidth: float, start_s: float):
        self.nodes = {n: SimNode() for n in nodes}
        self.disk, self.bandwidth, self.start_s = disk, bandwidth, start_s

    def place(self, sb: Sandbox, node: str, now: float) -> float | None:
        """Record the placement; returns when a new pull ends (None: no new pull)."""
        n = self.nodes[node]
        n.in_use[sb.image] += 1
        if sb.image in n.disk:
            n.disk.move_to_end(sb.image)
            sb.ready = now + self.start_s
            return None
        sb.waited_for_pull = True
        if sb.image in n.pulling:
            sb.ready = n.pulling[sb.image] + self.start_s
            return None
        begin = max(now, n.free_at)
        n.free_at = end = begin + sb.size / self.bandwidth
        n.pulling[sb.image] = end
        n.pulls += 1
        n.bytes_pulled += sb.size
        sb.ready = end + self.start_s
        return end

    def pulled(self, node: str, image: str, size: int) -> None:
        n = self.nodes[node]
        n.pulling.pop(image, None)
        used = sum(n.disk.values())
        for victim in [k for k in n.disk if n.in_use[k] == 0]:
            if used + size <= self.disk:
                break
            used -= n.disk.pop(victim)
            n.evictions += 1
        if used + size > self.disk:
            n.overflows += 1
        n.disk[image] = size

    def release(self, sb: Sandbox) -> None:
        self.nodes[sb.node].in_use[sb.image] -= 1


def workload(args: argparse.Namespace) -> list[Sandbox]:
    rng = random.Random(args.seed)
    lo, hi = args.image_gb
    out = []
    for k in range(args.images):
        image = f"127.0.0.1:5000/sandman-bench/task-{k:04d}:v1"
        size = int(rng.uniform(lo, hi) * GB)
        out += [Sandbox(len(out) + r, image, size, 0.0) for r in range(args.rollouts)]
    return out


def _digest_of(image: str) -> str:
    return "sha256:" + hashlib.sha256(image.encode()).hexdigest()


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Driver:
    """Plays the kubelets of the simulated nodes and replays the model's events."""

    def __init__(self, kube: KubeClient, ns: str, tag: str, scheduler: str, model: PullModel):
        self.kube, self.ns, self.tag, self.scheduler, self.model = kube, ns, tag, scheduler, model
        self.waiters: dict[str, asyncio.Future[str]] = {}
        self.ops: list[asyncio.Future[Any]] = []
        self.last: dict[str, asyncio.Future[Any]] = {}  # per object: writes stay in order

    def write(self, key: str, make: Any) -> None:
        """Queue an API write; writes to one object run in the order queued."""
        prev = self.last.get(key)

        async def run() -> Any:
            if prev is not None:
                await prev
            return await make()

        self.last[key] = fut = asyncio.ensure_future(run())
        self.ops.append(fut)

    def on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        node = obj["spec"].get("nodeName")
        fut = self.waiters.get(obj["metadata"]["name"])
        if node and fut is not None and not fut.done():
            fut.set_result(node)

    def node(self, name: str) -> dict[str, Any]:
        res = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti"}
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench"}
        ready |= {"lastHeartbeatTime": _now(), "lastTransitionTime": _now()}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {LABEL: self.tag}},
            "spec": {"taints": [{"key": LABEL, "value": self.tag, "effect": "NoSchedule"}]},
            "status": {"capacity": res, "allocatable": res, "conditions": [ready], "images": []},
        }

    async def heartbeats(self, nodes: list[str], stop: asyncio.Event) -> None:
        # The node lifecycle controller marks nodes without lease renewals
        # NotReady (tainting them) after ~50 s; the bench is their kubelet.
        while not stop.is_set():
            for n in nodes:
                spec = {"holderIdentity": n, "leaseDurationSeconds": 40, "renewTime": _now()}
                try:
                    await self.kube.patch(
                        LEASES, n, {"spec": spec}, "kube-node-lease", content_type=MERGE_PATCH
                    )
                except ApiError as e:
                    if not e.not_found:
                        raise
                    lease = {"metadata": {"name": n}, "spec": spec}
                    await self.kube.create(LEASES, lease, "kube-node-lease")
            await sleep_or(stop, 10)

    def pod(self, sb: Sandbox) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"sb-{sb.idx:05d}", "labels": {LABEL: self.tag}},
            "spec": {
                "schedulerName": self.scheduler,
                "nodeSelector": {LABEL: self.tag},
                "tolerations": [
                    {"key": LABEL, "operator": "Equal", "value": self.tag, "effect": "NoSchedule"}
                ],
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "main",
                        "image": sb.image,
                        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
                    }
                ],
            },
        }

    async def place(self, batch: list[Sandbox]) -> None:
        """Create the batch's pods together; wait until the scheduler bound each."""
        loop = asyncio.get_running_loop()
        for sb in batch:
            sb.pod = f"sb-{sb.idx:05d}"
            self.waiters[sb.pod] = loop.create_future()
        await asyncio.gather(*(self.kube.create(PODS, self.pod(sb), self.ns) for sb in batch))
        for sb in batch:
            sb.node = await asyncio.wait_for(self.waiters[sb.pod], 60)
            del self.waiters[sb.pod]

    def node_images(self, node: str) -> None:
        disk = self.model.nodes[node].disk
        images = [
            {"names": [f"{i.rsplit(':', 1)[0]}@{_digest_of(i)}", i], "sizeBytes": s}
            for i, s in sorted(disk.items(), key=lambda kv: -kv[1])[:50]
        ]
        path = NODES.path(name=node) + "/status"
        body = {"status": {"images": images}}
        self.write(
            path, lambda: self.kube.request("PATCH", path, body=body, content_type=MERGE_PATCH)
        )

    def started(self, sb: Sandbox) -> None:
        cs = {
            "name": "main",
            "image": sb.image,
            "imageID": f"{sb.image.rsplit(':', 1)[0]}@{_digest_of(sb.image)}",
            "ready": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": _now()}},
        }
        body = {"status": {"phase": "Running", "containerStatuses": [cs]}}
        path = PODS.path(self.ns, sb.pod) + "/status"
        self.write(
            sb.pod, lambda: self.kube.request("PATCH", path, body=body, content_type=MERGE_PATCH)
        )

    def finished(self, sb: Sandbox) -> None:
        self.write(sb.pod, lambda: self.kube.delete(PODS, sb.pod, self.ns, grace_period_s=0))

    async def flush(self, settle_s: float) -> None:
        ops, self.ops, self.last = self.ops, [], {}
        await asyncio.gather(*ops)
        await asyncio.sleep(settle_s)


PULLED, READY, FINISH, ARRIVE = range(4)  # same-instant order: arrivals see everything


async def simulate(driver: Driver, sandboxes: list[Sandbox], args: argparse.Namespace) -> None:
    queue = deque(sandboxes)
    heap: list[tuple[float, int, int, Any]] = []
    seq = itertools.count()
    for _ in range(min(args.concurrency, len(queue))):
        heapq.heappush(heap, (0.0, ARRIVE, next(seq), queue.popleft()))
    while heap:
        t, kind, _, item = heapq.heappop(heap)
        if kind == ARRIVE:
            batch = [item]
            while heap and heap[0][0] == t and heap[0][1] == ARRIVE:
                batch.append(heapq.heappop(heap)[3])
            await driver.flush(args.settle_ms / 1000)
            for sb in batch:
                sb.arrival = t
            await driver.place(batch)
            for sb in batch:
                end = driver.model.place(sb, sb.node, t)
                if end is not None:
                    heapq.heappush(heap, (end, PULLED, next(seq), sb))
                heapq.heappush(heap, (sb.ready, READY, next(seq), sb))
        elif kind == PULLED:
            driver.model.pulled(item.node, item.image, item.size)
            driver.node_images(item.node)
        elif kind == READY:
            driver.started(item)
            heapq.heappush(heap, (t + args.run_s, FINISH, next(seq), item))
        else:
            driver.model.release(item)
            driver.finished(item)
            if queue:
                heapq.heappush(heap, (t, ARRIVE, next(seq), queue.popleft()))
    await driver.flush(0)


async def _until(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await asyncio.to_thread(check):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


def _http_ok(url: str) -> bool:
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
        return bool(r.status == 200)


async def run_variant(
    cluster: LocalCluster, args: argparse.Namespace, variant: str, work: Path
) -> dict[str, Any]:
    tag = f"{variant}-{uuid.uuid4().hex[:6]}"
    ns, scheduler = f"bench-extender-{tag}", f"bench-{tag}"
    nodes = [f"bench-{tag}-{i}" for i in range(args.nodes)]
    model = PullModel(nodes, args.disk_gb * GB, args.pull_mbps * 1e6, args.start_s)
    stop = asyncio.Event()
    procs, tasks = [], []
    sandboxes = workload(args)
    async with KubeClient.from_kubeconfig(cluster.kubeconfig, user_agent="sandman-bench") as kube:
        driver = Driver(kube, ns, tag, scheduler, model)
        await kube.create(NAMESPACES, {"metadata": {"name": ns}})
        try:
            for n in nodes:
                await kube.create(NODES, driver.node(n))
            tasks.append(asyncio.ensure_future(driver.heartbeats(nodes, stop)))
            extenders = ()
            if variant == "sandman":
                port = free_port()
                # Modeled time runs ~100x faster than real time: a node's list
                # refutes an evicted image after 1 s, not the kubelet's 60.
                ext = extender_process(
                    port, cluster.kubeconfig, work, name=f"extender-{tag}", extra=["--report-lag=1"]
                )
                procs.append(ext)
                ext.start()
                await _until(lambda: _http_ok(ready_url(port)), "the extender")
                extenders = (extender_spec(port),)
            sport = free_port()
            sched = scheduler_process(
                cluster.binaries.kube_scheduler,
                cluster.layout.kubeconfig("scheduler"),
                work,
                name=scheduler,
                port=sport,
                extenders=extenders,
            )
            procs.append(sched)
            sched.start()
            await _until(lambda: _http_ok(f"https://127.0.0.1:{sport}/healthz"), "the scheduler")
            pods = Informer(kube, PODS, driver.on_pod, namespace=ns)
            tasks.append(asyncio.ensure_future(pods.run(stop)))
            await asyncio.wait_for(pods.synced.wait(), 30)
            t0 = time.monotonic()
            await simulate(driver, sandboxes, args)
            wall = time.monotonic() - t0
        finally:
            stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for p in reversed(procs):
                await asyncio.to_thread(p.stop)
            await kube.delete(NAMESPACES, ns)
            for n in nodes:
                for res, space in ((NODES, None), (LEASES, "kube-node-lease")):
                    with contextlib.suppress(ApiError):
                        await kube.delete(res, n, space)
    return summarize(variant, sandboxes, model, args, wall)


def summarize(
    variant: str, sandboxes: list[Sandbox], model: PullModel, args: argparse.Namespace, wall: float
) -> dict[str, Any]:
    ttfc = [sb.ready - sb.arrival for sb in sandboxes]
    groups: dict[str, set[str]] = {}
    for sb in sandboxes:
        groups.setdefault(sb.image, set()).add(sb.node)
    ns = model.nodes.values()
    return {
        f"{variant}_bytes_pulled_gb": sum(n.bytes_pulled for n in ns) / GB,
        f"{variant}_pulls": sum(n.pulls for n in ns),
        f"{variant}_pulls_per_node": [n.pulls for n in ns],
        f"{variant}_ttfc_p50_s": percentile(ttfc, 50),
        f"{variant}_ttfc_p99_s": percentile(ttfc, 99),
        f"{variant}_ttfc_max_s": max(ttfc),
        f"{variant}_waited_for_pull_frac": sum(sb.waited_for_pull for sb in sandboxes)
        / len(sandboxes),
        f"{variant}_nodes_per_image_mean": sum(len(g) for g in groups.values()) / len(groups),
        f"{variant}_evictions": sum(n.evictions for n in ns),
        f"{variant}_disk_overflows": sum(n.overflows for n in ns),
        f"{variant}_makespan_s": max(sb.ready for sb in sandboxes) + args.run_s,
        f"{variant}_bench_wall_s": wall,
    }


ASSUMPTIONS = [
    "one pull at a time per node, FIFO (kubelet serializeImagePulls: true)",
    "pull+unpack throughput --pull-mbps MB/s per node, whole image, no shared layers",
    "a pod joining a pull in progress starts when it ends; image present: --start-s",
    "image disk --disk-gb per node, LRU eviction of unused images when a pull completes",
    "sandbox runs --run-s after its start, then is deleted and the next one created",
    "rollouts of one problem queued together, problems in order, --concurrency alive",
    "TTFC = modeled creation-to-start time; real scheduling latency (ms) not modeled",
    "node.status.images = the modeled disk (both schedulers see it); pods stay "
    "bound-not-started during their modeled pull (the extender sees it)",
]


async def placement_study(cluster: LocalCluster, args: argparse.Namespace, work: Path) -> dict:
    out: dict[str, Any] = {}
    for variant in ("default", "sandman"):
        out |= await run_variant(cluster, args, variant, work)
    out["bytes_pulled_ratio"] = out["default_bytes_pulled_gb"] / out["sandman_bytes_pulled_gb"]
    out["ttfc_p99_ratio"] = out["default_ttfc_p99_s"] / out["sandman_ttfc_p99_s"]
    out["model"] = {
        "images": args.images,
        "rollouts": args.rollouts,
        "nodes": args.nodes,
        "concurrency": args.concurrency,
        "disk_gb": args.disk_gb,
        "pull_mbps": args.pull_mbps,
        "image_gb": list(args.image_gb),
        "run_s": args.run_s,
        "start_s": args.start_s,
        "seed": args.seed,
        "assumptions": ASSUMPTIONS,
    }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    if not args.skip_latency:
        results |= latency_study(args)
    if not args.skip_placement:
        bed = bench_bed(need_real_node=False)
        try:
            with tempfile.TemporaryDirectory(prefix="sandman-bench-extender-") as tmp:
                results |= asyncio.run(placement_study(bed.cluster, args, Path(tmp)))
        finally:
            bed.close()
    shown = [(k, v) for k, v in results.items() if isinstance(v, int | float)]
    print(table("extender", shown))
    return results
