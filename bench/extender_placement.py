"""Placement study: what the extender saves, default scheduler vs sandman-scheduler.

Both variants in one run on the same workload: the RL batch (500 task images
x 4 rollouts, at most 64 sandboxes at once) on 10 simulated nodes with
limited image disk. A real kube-scheduler decides every placement: once with
a plain profile (what the default scheduler does), once with the extender.
Pulls are not performed but modeled from the decisions (``extender_model``);
the bench plays the kubelets, so the schedulers and the extender see the
modeled world: node.status.images lists what the modeled disk holds, and a
pod stays bound-but-not-started for exactly its modeled pull.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import hashlib
import heapq
import itertools
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from sandman.bench.extender_model import ASSUMPTIONS, GB, PullModel, Sandbox, summarize, workload
from sandman.contract import LABEL_BENCH
from sandman.harness.cluster.extender import (
    extender_process,
    extender_spec,
    ready_url,
    scheduler_process,
)
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.probes import http_ok
from sandman.harness.testing import free_port
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

LEASES = Resource("coordination.k8s.io", "v1", "leases")
LABEL = LABEL_BENCH + "-extender"


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
                await _until(lambda: http_ok(ready_url(port)), "the extender")
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
            await _until(
                lambda: http_ok(f"https://127.0.0.1:{sport}/healthz", insecure=True),
                "the scheduler",
            )
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
