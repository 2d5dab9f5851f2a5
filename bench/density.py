"""`sandman bench density`: fill the real node with idle sandboxes; memory per sandbox.

Sandboxes (the `tiny` image, `sleep infinity`, the daemon injected) are
created in batches until the node holds as many pods as its capacity allows
(110 by default, counting the pods already there), then left idle for
`--settle` seconds. Memory is read at node level from the kernel:

- each pod's memory cgroup under the kubelet's cgroup root
  (`/sys/fs/cgroup/memory/<root>/kubepods/<qos>/pod<uid>`): `usage_in_bytes`
  (what the kernel charges the pod, page cache included: the copied daemon
  tree is written into the pod's emptyDir), the working set as the kubelet
  counts it (usage minus inactive file pages) and `total_rss`;
- the runtime's per-pod process outside the pod cgroup (containerd's runc
  shim), as PSS;
- the node: the `kubepods` cgroup's usage and `MemAvailable` before and
  after filling, divided by the sandboxes added.

How many sandboxes fit: the node's allocatable memory over the per-sandbox
working set (plus the shim, which the node pays too), next to its pod limit.
`--delivery copy,shared` measures both ways the daemon reaches a pod.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

from sandman.bench.delivery import deliveries, delivery_policy, wait_delivery
from sandman.bench.podstart import COMMAND, REAL
from sandman.bench.report import table
from sandman.client import Sandbox, SandboxStartError, SandmanClient
from sandman.contract import LABEL_BENCH
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.testing import real_node_bench
from sandman.kube_async import NAMESPACES, NODES, PODS, KubeClient, list_all
from sandman.quantity import parse_quantity

MB = 1 << 20
MEMORY_CGROUP = Path("/sys/fs/cgroup/memory")
CPU_CGROUP = Path("/sys/fs/cgroup/cpuacct")
QOS_DIRS = ("burstable", "besteffort", "")  # Guaranteed pods sit directly under kubepods
# Start failures that mean the node is full (what density measures); others
# (admission timing out on a loaded machine) are retried, up to MAX_RETRIES.
FULL = (SandboxStartError.UNSCHEDULABLE, SandboxStartError.QUOTA, SandboxStartError.CRASHED)
MAX_RETRIES = 40


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--delivery", default="copy,shared", help="copy, shared or copy,shared")
    p.add_argument("--fill", type=int, default=0, help="sandboxes to add (0: up to the pod limit)")
    p.add_argument("--batch", type=int, default=16, help="sandboxes created at once")
    p.add_argument("--settle", type=float, default=20.0, help="idle seconds before reading")
    p.add_argument("--image", default="tiny")


def run(args: argparse.Namespace) -> dict[str, Any]:
    asked = deliveries(args.delivery)
    with real_node_bench(args.image) as (cluster, node, ref):
        results: dict[str, Any] = {"image": ref}
        for delivery in asked:
            with delivery_policy(cluster, delivery) as ns_labels:
                results[delivery] = asyncio.run(
                    _fill(args, cluster, node, ref, delivery, ns_labels)
                )
    print(table("density: idle sandboxes on the real node", rows(results)))
    return results


async def _fill(
    args: argparse.Namespace,
    cluster: LocalCluster,
    node: RealNode,
    image: str,
    delivery: str,
    ns_labels: dict[str, str],
) -> dict[str, Any]:
    ns = f"bench-density-{secrets.token_hex(3)}"
    root = MEMORY_CGROUP / node.node.cgroup_root.strip("/") / "kubepods"
    kube = KubeClient.from_kubeconfig(cluster.kubeconfig, max_connections=128)
    async with SandmanClient(kube=kube, namespace=ns, transport="direct") as client:
        await kube.create(NAMESPACES, {"metadata": {"name": ns, "labels": ns_labels}})
        made: list[Sandbox] = []
        try:
            await wait_delivery(client, image, delivery)
            node_obj = await kube.get(NODES, node.node.name)
            pod_limit = int(node_obj["status"]["capacity"]["pods"])
            allocatable = int(parse_quantity(node_obj["status"]["allocatable"]["memory"]))
            before_pods = await _pods_on(kube, node.node.name)
            room = pod_limit - before_pods
            want = min(room, args.fill) if args.fill else room
            base_kubepods = _read_int(root / "memory.usage_in_bytes")
            base_available = _meminfo("MemAvailable")
            load0 = os.getloadavg()[0]
            t0 = time.monotonic()
            stopped = ""
            retried: list[str] = []
            seq = 0
            while len(made) < want and not stopped:
                n = min(args.batch, want - len(made))
                got = await asyncio.gather(
                    *(_create(client, image, f"d{seq + i}") for i in range(n)),
                    return_exceptions=True,
                )
                seq += n
                for g in got:
                    if isinstance(g, Sandbox):
                        made.append(g)
                        continue
                    what = failure_action(g, len(retried))
                    if what == "full":
                        stopped = stopped or f"{g.reason}: {g.message}"  # type: ignore[union-attr]
                    elif what == "retry":
                        retried.append(f"{g.reason}: {g.message}"[:300])  # type: ignore[union-attr]
                    else:
                        raise g  # type: ignore[misc]
            fill_s = time.monotonic() - t0
            await asyncio.sleep(args.settle)
            per_pod = [_pod_cgroup(root, sb.pod["metadata"]["uid"]) for sb in made]
            shims = _shim_pss(node, ns)
            kubepods = _read_int(root / "memory.usage_in_bytes")
            available = _meminfo("MemAvailable")
            n = len(made)
            if n == 0:
                raise RuntimeError(f"no sandbox started on the node: {stopped}")
            out: dict[str, Any] = {
                "sandboxes": n,
                "pods_on_node_before": before_pods,
                "pod_limit": pod_limit,
                "stopped_by": stopped or None,
                "retried": retried,
                "fill_s": round(fill_s, 1),
                "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)],
                "allocatable_mib": round(allocatable / MB),
            }
            for key in ("usage", "working_set", "rss", "cache"):
                vals = [p[key] / MB for p in per_pod if p]
                out[f"pod_{key}_mib_p50"] = round(statistics.median(vals), 2) if vals else None
                out[f"pod_{key}_mib_max"] = round(max(vals), 2) if vals else None
            cpus = [p["cpu_ns"] / 1e6 for p in per_pod if p and "cpu_ns" in p]
            out["pod_cpu_ms_p50"] = round(statistics.median(cpus)) if cpus else None
            out["shim_pss_mib_p50"] = round(statistics.median(shims) / 1024, 2) if shims else None
            grown = (kubepods - base_kubepods) / MB
            out["node_kubepods_delta_mib_per_sandbox"] = round(grown / n, 2)
            out["node_available_delta_mib_per_sandbox"] = round(
                (base_available - available) / 1024 / n, 2
            )
            per_sandbox = (out["pod_working_set_mib_p50"] or 0) + (out["shim_pss_mib_p50"] or 0)
            out["per_sandbox_mib"] = round(per_sandbox, 2)
            fit = int(allocatable / MB // per_sandbox) if per_sandbox else None
            out["fit_in_allocatable"] = fit
            out["fit"] = min(fit, pod_limit) if fit is not None else pod_limit
            out["limited_by"] = "pods" if fit is None or fit >= pod_limit else "memory"
            print(
                f"[{delivery}] {n} idle sandboxes: working set p50 "
                f"{out['pod_working_set_mib_p50']} MiB + shim {out['shim_pss_mib_p50']} MiB; "
                f"node {out['node_available_delta_mib_per_sandbox']} MiB each; "
                f"{fit} fit in {out['allocatable_mib']} MiB",
                flush=True,
            )
            return out
        finally:
            await asyncio.gather(*(sb.release() for sb in made), return_exceptions=True)
            with contextlib.suppress(Exception):
                await _gone(kube, ns)
            await kube.delete(NAMESPACES, ns)


def failure_action(err: BaseException, retried: int) -> str:
    """What a failed start means for the fill: ``full`` (the node holds no
    more: stop and say why), ``retry`` (not the node filling up, e.g. an
    admission call that timed out on a loaded machine: counted, tried again,
    at most MAX_RETRIES times in all) or ``raise``."""
    if not isinstance(err, SandboxStartError):
        return "raise"
    if err.reason in FULL:
        return "full"
    return "retry" if retried < MAX_RETRIES else "raise"


async def _create(client: SandmanClient, image: str, name: str) -> Sandbox:
    return await Sandbox.create(
        client, image, name=name, command=COMMAND, node_selector=REAL,
        labels={LABEL_BENCH: "density"}, timeout_s=600,
        unschedulable_grace=dt.timedelta(seconds=20),
    )  # fmt: skip


async def _pods_on(kube: KubeClient, node: str) -> int:
    pods, _ = await list_all(kube, PODS, None, field_selector=f"spec.nodeName={node}")
    return sum(
        1 for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    )


async def _gone(kube: KubeClient, ns: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods, _ = await list_all(kube, PODS, ns)
        if not pods:
            return
        await asyncio.sleep(1)


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


def _meminfo(key: str) -> int:
    """A /proc/meminfo field in KiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def memory_stat(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if v.strip().isdigit():
            out[k] = int(v)
    return out


def pod_figures(usage: int, stat: dict[str, int]) -> dict[str, int]:
    """A pod cgroup's figures (bytes): the working set is usage minus inactive
    file pages, as the kubelet and cAdvisor count it (never below zero)."""
    inactive = stat.get("total_inactive_file", 0)
    return {
        "usage": usage,
        "working_set": max(0, usage - inactive),
        "rss": stat.get("total_rss", 0),
        "cache": stat.get("total_cache", 0),
    }


def _pod_cgroup(root: Path, uid: str) -> dict[str, int] | None:
    for qos in QOS_DIRS:
        cg = root / qos / f"pod{uid}" if qos else root / f"pod{uid}"
        with contextlib.suppress(OSError):
            usage = _read_int(cg / "memory.usage_in_bytes")
            got = pod_figures(usage, memory_stat((cg / "memory.stat").read_text()))
            # CPU the pod used since it was created (its start, then idling):
            # the cpuacct hierarchy mirrors the memory one.
            cpu = CPU_CGROUP / cg.relative_to(MEMORY_CGROUP) / "cpuacct.usage"
            with contextlib.suppress(OSError, ValueError):
                got["cpu_ns"] = _read_int(cpu)
            return got
    return None


def _shim_pss(node: RealNode, ns: str) -> list[int]:
    """PSS (KiB) of each pod's runc shim (one per pod sandbox, named by its id)."""
    ids = set(node.crictl("pods", "-q", "--namespace", ns).split())
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if not cmd or b"containerd-shim" not in cmd[0]:
                continue
            args = [c.decode(errors="replace") for c in cmd]
            if "-id" in args and args[args.index("-id") + 1] in ids:
                out.append(_pss_kb(int(entry)))
    return out


def _pss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def rows(results: dict[str, Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for delivery, doc in results.items():
        if not isinstance(doc, dict):
            continue
        for k, v in doc.items():
            out.append((f"{delivery}.{k}", v))
    return out
