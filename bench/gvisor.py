"""`sandman bench gvisor`: sandboxes under gVisor (RuntimeClass gvisor) vs runc, side by side.

On the real node, in one run, with the `tiny` image already on the node:

- start-up: N sandboxes per runtime, created one after the other and
  interleaved (runc, gvisor, runc, ...) so both see the same machine load;
  create -> Ready as the SDK observes it (webhook, scheduling, pod sandbox,
  init container, daemon, readiness probe), split into the SDK's phases; and
  the daemon's own start (its interpreter and imports: `sandmand ... version`
  run inside the sandbox, minus an exec of `true`);
- exec latency: sequential `POST /v1/exec {"cmd": ["true"]}` from the host
  to the daemon (raw HTTP, one connection), p50/p99;
- file throughput: `PUT`/`GET /v1/files` of 1 MB and 100 MB (write and read
  timed apart, content checked) into the sandbox's /tmp;
- memory of an idle sandbox: PSS of every host process that belongs to the
  pod (containerd shims, runsc's sandbox/gofer/wait processes, and everything
  in the pod's cgroup), and the pod cgroup's memory usage.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes.client import CoreV1Api

from sandman.bench.daemon import exec_latencies
from sandman.bench.report import percentile
from sandman.client import Sandbox, SandmanClient
from sandman.contract import ANN_KEY_ID, DAEMON_ARGV, DAEMON_PORT, LABEL_NODE_KIND, annotations
from sandman.harness.cluster import gvisor
from sandman.harness.cluster.config import Versions
from sandman.harness.cluster.node import RealNode
from sandman.harness.images.build import ImageBuilder
from sandman.harness.kube import api_client
from sandman.harness.testing import bench_bed
from sandman.kube_async import PODS, ApiError

RUNTIMES = ("runc", "gvisor")
REAL = {LABEL_NODE_KIND: "real"}
MB = 1 << 20
# Let a fresh sandbox settle (daemon start-up garbage, first probes) before
# its memory is read.
IDLE_SETTLE_S = 5.0
MEMORY_CGROUP = Path("/sys/fs/cgroup/memory")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--starts", type=int, default=10, help="sandboxes created per runtime")
    p.add_argument("--execs", type=int, default=300, help="sequential execs per runtime")
    p.add_argument("--file-reps", type=int, default=3, help="write+read rounds per file size")
    p.add_argument("--sizes-mb", default="1,100", help="file sizes, MB")


def run(args: argparse.Namespace) -> dict[str, Any]:
    bed = bench_bed(need_real_node=True)
    try:
        cluster = bed.cluster
        node = cluster.real_node
        assert node is not None
        tiny = ImageBuilder(cluster.config.cache_dir).build_and_push("tiny", node.registry).ref
        node.crictl("pull", tiny)  # start-up without the pull
        core = CoreV1Api(api_client(cluster.kubeconfig))
        ns = f"bench-gvisor-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": ns}})
        try:
            results = asyncio.run(_bench(args, str(cluster.kubeconfig), ns, tiny, node))
        finally:
            core.delete_namespace(ns)
    finally:
        bed.close()
    print(markdown_table(results))
    return results


async def _bench(
    args: argparse.Namespace, kubeconfig: str, ns: str, image: str, node: RealNode
) -> dict[str, Any]:
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    out: dict[str, Any] = {
        "starts": args.starts,
        "execs": args.execs,
        "image": image,
        "gvisor_version": Versions().gvisor,
        "load_avg_start": os.getloadavg()[0],
    }
    async with SandmanClient(kubeconfig=kubeconfig, namespace=ns, transport="direct") as c:
        starts: dict[str, list[dict[str, float]]] = {r: [] for r in RUNTIMES}
        for _ in range(args.starts):
            for rt in RUNTIMES:
                starts[rt].append(await _one_start(c, image, rt))
        for rt in RUNTIMES:
            out[rt] = _start_summary(starts[rt])
        for rt in RUNTIMES:
            sb = await _create(c, image, rt)
            try:
                await asyncio.sleep(IDLE_SETTLE_S)
                out[rt].update(pod_memory(node, ns, sb.name, sb.pod["metadata"]["uid"]))
                token = await c.token_for(sb.namespace, sb.id, annotations(sb.pod).get(ANN_KEY_ID))
                url = f"http://{sb.ip}:{DAEMON_PORT}"
                lat = await exec_latencies(url, token, args.execs)
                out[rt]["exec_p50_ms"] = percentile(lat, 50)
                out[rt]["exec_p99_ms"] = percentile(lat, 99)
                for size in sizes:
                    out[rt].update(await _files(url, token, size, args.file_reps))
            finally:
                await sb.release()
    out["load_avg_end"] = os.getloadavg()[0]
    return out


async def _create(c: SandmanClient, image: str, runtime: str) -> Sandbox:
    async def create_fn(body: dict[str, Any], ns: str) -> dict[str, Any]:
        if runtime == "gvisor":
            body["spec"]["runtimeClassName"] = gvisor.RUNTIME_CLASS
        return await c.kube.create(PODS, body, ns)

    sb = await Sandbox.create(
        c,
        image,
        node_selector=REAL,
        command=["sleep", "3600"],
        ttl="30m",
        create_fn=create_fn if runtime == "gvisor" else None,
    )
    want = gvisor.RUNTIME_CLASS if runtime == "gvisor" else None
    got = sb.pod["spec"].get("runtimeClassName")
    if got != want:
        await sb.release()
        raise RuntimeError(f"{sb.name}: runtimeClassName {got!r}, wanted {want!r}")
    return sb


async def _one_start(c: SandmanClient, image: str, runtime: str) -> dict[str, float]:
    sb = await _create(c, image, runtime)
    try:
        t = sb.timings
        assert t.ready is not None
        sample = {"ready_s": t.ready - t.requested}
        for k, v in t.phases().items():
            if v is not None and k in ("schedule_s", "start_s", "ready_s"):
                sample[f"phase_{k}"] = v
        t0 = time.perf_counter()
        r = await sb.exec(["true"])
        exec_true = time.perf_counter() - t0
        t0 = time.perf_counter()
        v = await sb.exec([*DAEMON_ARGV, "version"])
        version = time.perf_counter() - t0
        if r.exit_code != 0 or v.exit_code != 0:
            raise RuntimeError(f"{sb.name}: exec failed: {r} {v}")
        sample["daemon_start_s"] = max(0.0, version - exec_true)
        return sample
    finally:
        await sb.release()
        await _gone(c, sb)


async def _gone(c: SandmanClient, sb: Sandbox) -> None:
    # The next start should not share the machine with this one's teardown.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            await c.kube.get(PODS, sb.name, sb.namespace)
        except ApiError as e:
            if e.not_found:
                return
            raise
        await asyncio.sleep(0.5)


def _start_summary(samples: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples if key in s]
        out[f"{key}_p50"] = statistics.median(values)
        out[f"{key}_max"] = max(values)
    return out


async def _files(url: str, token: str, size_mb: int, reps: int) -> dict[str, float]:
    data = os.urandom(size_mb * MB)
    digest = hashlib.sha256(data).digest()
    path = f"/tmp/bench-{size_mb}mb"
    writes, reads = [], []
    timeout = aiohttp.ClientTimeout(total=600)
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:
        for _ in range(reps):
            t0 = time.perf_counter()
            async with http.put(f"{url}/v1/files", params={"path": path}, data=data) as r:
                if r.status >= 300:
                    raise RuntimeError(f"write {path}: {r.status} {await r.text()}")
            writes.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            async with http.get(f"{url}/v1/files", params={"path": path}) as r:
                got = await r.read()
            reads.append(time.perf_counter() - t0)
            if hashlib.sha256(got).digest() != digest:
                raise RuntimeError(f"read {path}: {len(got)} bytes differ from what was written")
    return {
        f"write_{size_mb}mb_MBps": size_mb / statistics.median(writes),
        f"read_{size_mb}mb_MBps": size_mb / statistics.median(reads),
    }


# -- memory of one pod, from the host ---------------------------------------------
def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pids_with_any(needles: set[str]) -> set[int]:
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            if any(n in cmd for n in needles):
                out.add(int(entry))
    return out


def _pod_cgroup(pod_uid: str) -> Path | None:
    # cgroupfs driver: <root>/kubepods/<qos>/pod<uid> (Guaranteed pods sit
    # directly under kubepods).
    return next(iter(MEMORY_CGROUP.rglob(f"pod{pod_uid}")), None)


def pod_memory(node: RealNode, ns: str, name: str, pod_uid: str) -> dict[str, float]:
    """PSS (MB) of the pod's host processes, and its cgroup's memory usage (MB)."""
    pod_ids = node.crictl("pods", "-q", "--namespace", ns, "--name", f"^{name}$").split()
    ids = set(pod_ids)
    for pid in pod_ids:
        ids.update(node.crictl("ps", "-a", "-q", "--pod", pid).split())
    # Shims carry `-id <id>`; runsc's processes name the container they serve.
    pids = _pids_with_any(ids)
    cg = _pod_cgroup(pod_uid)
    usage = 0.0
    if cg is not None:
        for procs in cg.rglob("cgroup.procs"):
            pids.update(int(p) for p in procs.read_text().split())
        usage = int((cg / "memory.usage_in_bytes").read_text()) / MB
    names: collections.Counter[str] = collections.Counter()
    for p in pids:
        with contextlib.suppress(OSError):
            names[Path(f"/proc/{p}/comm").read_text().strip()] += 1
    return {
        "idle_pss_mb": sum(_pss_kb(p) for p in pids) / 1024,
        "idle_processes": len(pids),
        "idle_process_names": dict(sorted(names.items())),
        "idle_cgroup_mb": usage,
    }


# -- the side-by-side table --------------------------------------------------------
ROWS = (
    ("create -> Ready p50 (s)", "ready_s_p50", "{:.2f}"),
    ("create -> Ready max (s)", "ready_s_max", "{:.2f}"),
    # The kubelet usually reports "running" and Ready in one status update, so
    # the SDK's started->ready phase is ~0 and not shown; scheduled->running
    # holds the pod sandbox, the init container and the daemon's start.
    ("  scheduled -> running and Ready p50 (s)", "phase_start_s_p50", "{:.2f}"),
    ("daemon start (interpreter + imports) p50 (ms)", "daemon_start_s_p50", "ms"),
    ("exec `true` p50 (ms)", "exec_p50_ms", "{:.1f}"),
    ("exec `true` p99 (ms)", "exec_p99_ms", "{:.1f}"),
    ("write 1 MB (MB/s)", "write_1mb_MBps", "{:.0f}"),
    ("read 1 MB (MB/s)", "read_1mb_MBps", "{:.0f}"),
    ("write 100 MB (MB/s)", "write_100mb_MBps", "{:.0f}"),
    ("read 100 MB (MB/s)", "read_100mb_MBps", "{:.0f}"),
    ("idle sandbox PSS, all its host processes (MB)", "idle_pss_mb", "{:.1f}"),
    ("idle sandbox host processes", "idle_processes", "{:d}"),
    ("idle pod cgroup memory usage (MB)", "idle_cgroup_mb", "{:.1f}"),
)


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "ms":
        return f"{value * 1000:.0f}"
    return fmt.format(value)


def markdown_table(results: dict[str, Any]) -> str:
    lines = ["| | runc | gVisor | gVisor / runc |", "|---|---|---|---|"]
    runc, gv = results["runc"], results["gvisor"]
    for label, key, fmt in ROWS:
        a, b = runc.get(key), gv.get(key)
        ratio = f"{b / a:.2f}" if a and b is not None else "-"
        lines.append(f"| {label} | {_fmt(a, fmt)} | {_fmt(b, fmt)} | {ratio} |")
    return "\n".join(lines)
