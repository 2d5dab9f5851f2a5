"""/prioritize latency: what the extender costs the scheduler.

An extender process (the real app on the shared server shape) serves a
synthetic index of 5,000 nodes and 10,000 tracked images; it is asked
sequentially (as the scheduler does) for realistic sandbox pods with 1,000
and 5,000 candidate nodes over loopback HTTP; p50/p99 as the client sees them.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import json
import multiprocessing as mp
import random
import socket
import time
import uuid
from typing import Any

from sandman.bench.report import percentile
from sandman.contract import ANN_INJECTED, ANN_TTL, LABEL_ID, LABEL_SANDBOX
from sandman.extender.config import ExtenderConfig
from sandman.extender.index import ImageIndex
from sandman.extender.observe import ContainerImage, ImageEntry, NodeReport, PodReport
from sandman.harness.testing import free_port

GB = 10**9
DAEMON = "127.0.0.1:5000/sandman/daemon:bench"
INDEX_NODES = 5000


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
    """The extender's app on the shared server shape (as `sandman extender
    serve` runs it), over a caller-filled index; stops at SIGTERM."""
    from sandman.extender.server import create_app
    from sandman.serving import serve_app

    ix = synthetic_index(nodes, images, seed)
    gc.collect()
    gc.freeze()  # as the real server does once its watches have listed
    app = create_app(ExtenderConfig(watch=False), None, index=ix)
    asyncio.run(serve_app(app, host="127.0.0.1", port=port))


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
        target=_serve_synthetic,
        args=(port, INDEX_NODES, args.tracked_images, args.seed),
        daemon=True,
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
        names = [f"node-{n:05d}" for n in range(INDEX_NODES)]
        out: dict[str, Any] = {}
        for label, count in (("1k", 1000), ("5k", 5000)):
            lat = _latencies(port, names[:count], args.tracked_images, args.latency_requests)
            out[f"prioritize_p50_ms_{label}"] = percentile(lat, 50)
            out[f"prioritize_p99_ms_{label}"] = percentile(lat, 99)
        out["latency_tracked_images"] = args.tracked_images
        out["latency_index_nodes"] = INDEX_NODES
        return out
    finally:
        proc.terminate()
        proc.join(10)
