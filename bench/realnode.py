"""`sandman bench realnode`: pod create -> Ready on the real node, cold vs cached image.

For each image (tiny, swe) and each case, N pods are created one after the
other; the time from the create call to the pod's Ready condition is taken
from a watch. "cold": before each pod, every pod of that image is gone from
the node and the image is removed from containerd (its content is garbage-
collected), so the kubelet pulls it from the local registry for real.
"cached": the image is already on the node. The kubelet's own events confirm
which case each pod was (Pulling vs "already present").
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from typing import Any

from kubernetes import watch
from kubernetes.client import CoreV1Api

from sandman.bench.report import percentile, table
from sandman.harness.cluster.node import RealNode
from sandman.harness.images.build import ImageBuilder
from sandman.harness.kube import api_client, raw
from sandman.harness.testing import bench_bed, real_pod, wait_for

IMAGES = ("tiny", "swe")
COMMAND = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=10, help="pods per image and case")
    p.add_argument("--images", default=",".join(IMAGES))


def run(args: argparse.Namespace) -> dict[str, Any]:
    bed = bench_bed(need_real_node=True)
    try:
        cluster = bed.cluster
        node = cluster.real_node
        assert node is not None
        core = CoreV1Api(api_client(cluster.kubeconfig))
        builder = ImageBuilder(cluster.config.cache_dir)
        ns = f"bench-realnode-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": ns}})
        results: dict[str, Any] = {}
        rows = []
        try:
            for name in args.images.split(","):
                ref = builder.build_and_push(name, node.registry).ref
                for case in ("cold", "cached"):
                    samples, pulled = _measure(core, node, ns, ref, name, case, args.runs)
                    key = f"{name}_{case}"
                    med = statistics.median(samples)
                    results[f"{key}_ready_p50_s"] = med
                    results[f"{key}_ready_max_s"] = max(samples)
                    results[f"{key}_pulls"] = pulled
                    rows += [
                        (f"{key} create->Ready p50 (s)", med),
                        (f"{key} create->Ready p90 (s)", percentile(samples, 90)),
                        (f"{key} pods that pulled", f"{pulled}/{len(samples)}"),
                    ]
                results[f"{name}_cold_over_cached"] = (
                    results[f"{name}_cold_ready_p50_s"] / results[f"{name}_cached_ready_p50_s"]
                )
                rows.append((f"{name} cold/cached ratio", results[f"{name}_cold_over_cached"]))
        finally:
            core.delete_namespace(ns)
        results["runs"] = args.runs
        print(table("real node: pod create -> Ready", rows))
        return results
    finally:
        bed.close()


def _measure(
    core: CoreV1Api, node: RealNode, ns: str, ref: str, name: str, case: str, runs: int
) -> tuple[list[float], int]:
    samples: list[float] = []
    pulled = 0
    for i in range(runs):
        pod_name = f"{name}-{case}-{i}"
        if case == "cold":
            _forget_image(node, ref)
        elif i == 0:
            _ensure_image(node, ref)
        samples.append(_create_until_ready(core, ns, pod_name, ref))
        if _pulled(core, ns, pod_name):
            pulled += 1
        core.delete_namespaced_pod(pod_name, ns, grace_period_seconds=1)
        _wait_pod_gone(node, core, ns, pod_name)
    return samples, pulled


def _create_until_ready(core: CoreV1Api, ns: str, name: str, ref: str) -> float:
    ready = threading.Event()
    started = threading.Event()
    w = watch.Watch()

    def watcher() -> None:
        stream = w.stream(
            core.list_namespaced_pod,
            ns,
            field_selector=f"metadata.name={name}",
            timeout_seconds=300,
        )
        started.set()
        for ev in stream:
            conds = ev["object"].status.conditions or []
            if any(c.type == "Ready" and c.status == "True" for c in conds):
                ready.set()
                w.stop()

    th = threading.Thread(target=watcher, daemon=True)
    th.start()
    started.wait(5)
    time.sleep(0.1)  # the watch request is on the wire
    t0 = time.monotonic()
    core.create_namespaced_pod(ns, real_pod(name, ref, COMMAND))
    if not ready.wait(300):
        raise RuntimeError(f"pod {ns}/{name} not Ready within 300s")
    elapsed = time.monotonic() - t0
    th.join(5)
    return elapsed


def _pulled(core: CoreV1Api, ns: str, name: str) -> bool:
    def events() -> list[dict[str, Any]] | None:
        items = raw(
            core.list_namespaced_event(
                ns, field_selector=f"involvedObject.name={name}", _preload_content=False
            )
        )["items"]
        return items if any(e["reason"] == "Pulled" for e in items) else None

    items = wait_for(events, timeout=30, what=f"Pulled event of {name}")
    return any(e["reason"] == "Pulling" for e in items)


def _images(node: RealNode) -> set[str]:
    doc = json.loads(node.crictl("images", "-o", "json"))
    return {t for img in doc.get("images", []) for t in img.get("repoTags") or []}


def _forget_image(node: RealNode, ref: str) -> None:
    doc = json.loads(node.crictl("images", "-o", "json"))
    ids = {img["id"] for img in doc.get("images", []) if ref in (img.get("repoTags") or [])}
    users = [
        c["labels"].get("io.kubernetes.pod.namespace", "?")
        + "/"
        + c["labels"].get("io.kubernetes.pod.name", "?")
        for c in json.loads(node.crictl("ps", "-a", "-o", "json")).get("containers", [])
        if c.get("imageRef") in ids or c.get("image", {}).get("image") in ids
    ]
    if users:
        # Its layers stay on the node while any container uses them, so a
        # "cold" pod would not pull for real: refuse instead of mismeasuring.
        raise RuntimeError(f"cannot measure a cold start of {ref}: in use by {users}")
    if ids:
        node.crictl("rmi", ref)


def _ensure_image(node: RealNode, ref: str) -> None:
    if ref not in _images(node):
        node.crictl("pull", ref)


def _wait_pod_gone(node: RealNode, core: CoreV1Api, ns: str, name: str) -> None:
    def gone() -> bool:
        pods = raw(core.list_namespaced_pod(ns, _preload_content=False))["items"]
        return not any(p["metadata"]["name"] == name for p in pods)

    wait_for(gone, timeout=120, what=f"pod {name} deleted")
    # The kubelet has stopped the sandbox but removes it only at its next
    # container GC (once a minute); a stopped container still holds the
    # image's snapshots and would make the next "cold" pull partly warm, so
    # remove it now rather than wait.
    for sandbox in node.crictl("pods", "-q", "--name", f"^{name}$").split():
        node.crictl("rmp", "--force", sandbox)
