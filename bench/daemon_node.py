"""The real-node half of `sandman bench daemon`: the daemon in pods, and vs `kubectl exec`.

Start-up in a pod (``--pod-starts`` sandboxes of the busybox-only `tiny` image,
one after another, created the way users do: a labeled pod, the webhook
injects the daemon): from the container's start (the start time of its PID 1,
which runc created and which then became the daemon) to the first `/healthz`
200 seen from the host; the daemon's CPU at that moment and the container
cgroup's (runc's setup in the container included); resident memory after 2 s
idle (the daemon's RSS, and the cgroup's memory.current, which also counts
the page cache of the copied tree); the disk of ``/.sandman`` in the pod.
These read the host's /proc and cgroup files, so they run where the real
node runs (this machine).

Then one sandbox times the same command (`true`) three ways in the same run:
raw HTTP to the daemon from the host, the SDK's `Sandbox.exec` over its
direct transport, and `kubectl exec`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes.client import CoreV1Api

from sandman.bench.daemon import _proc_cpu_rss, exec_latencies
from sandman.bench.report import percentile
from sandman.client import Sandbox, SandmanClient
from sandman.contract import DAEMON_ARGV, DAEMON_DIR, DAEMON_PORT, LABEL_SANDBOX
from sandman.harness.cluster.kwok_nodes import NODE_KIND_LABEL
from sandman.harness.images.build import ImageBuilder
from sandman.harness.kube import api_client
from sandman.harness.testing import bench_bed

SDK_EXECS = 500


async def _sdk_and_http(kubeconfig: str, ns: str, image: str) -> dict[str, Any]:
    async with SandmanClient(kubeconfig=kubeconfig, namespace=ns, transport="direct") as c:
        sb = await Sandbox.create(
            c, image, node_selector={NODE_KIND_LABEL: "real"}, command=["sleep", "3600"], ttl="30m"
        )
        token = await c.token_for(sb.namespace, sb.id)
        http = await exec_latencies(f"http://{sb.ip}:7878", token, SDK_EXECS)
        sdk = []
        for _ in range(20):  # warm the pool
            await sb.exec(["true"])
        for _ in range(SDK_EXECS):
            t = time.perf_counter()
            r = await sb.exec(["true"])
            sdk.append((time.perf_counter() - t) * 1000)
            assert r.exit_code == 0
        return {"name": sb.name, "http": http, "sdk": sdk, "ttfc_s": sb.timings.phases()["ttfc_s"]}


def _boottime_s() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _daemon_pid(pod_uid: str) -> int | None:
    """Host pid of the pod's daemon (PID 1 of its sandbox container)."""
    marker = pod_uid.replace("-", "_")
    for stat in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv0 = stat.read_bytes().split(b"\0", 1)[0]
            if argv0 != DAEMON_ARGV[0].encode():
                continue
            cgroup = (stat.parent / "cgroup").read_text()
        except OSError:
            continue
        if pod_uid in cgroup or marker in cgroup:
            return int(stat.parent.name)
    return None


class ContainerCgroup:
    """CPU and memory of a process's container, from its cgroup (v2, or v1's
    cpuacct and memory controllers, as this machine has)."""

    def __init__(self, pid: int) -> None:
        self.paths: dict[str, str] = {}
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                self.paths[c] = path.lstrip("/")
        self.v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()

    def _dir(self, controller: str) -> Path:
        if self.v2:
            return Path("/sys/fs/cgroup") / self.paths[""]
        return Path("/sys/fs/cgroup") / controller / self.paths[controller]

    def cpu_ms(self) -> float:
        if self.v2:
            stat = (self._dir("") / "cpu.stat").read_text().splitlines()
            return int(next(ln for ln in stat if ln.startswith("usage_usec")).split()[1]) / 1000
        return int((self._dir("cpuacct") / "cpuacct.usage").read_text()) / 1e6

    def memory_mib(self) -> float:
        if self.v2:
            return int((self._dir("") / "memory.current").read_text()) / 2**20
        return int((self._dir("memory") / "memory.usage_in_bytes").read_text()) / 2**20


def _healthz(ip: str) -> bool:
    try:
        with socket.create_connection((ip, DAEMON_PORT), timeout=0.5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def pod_start(core: CoreV1Api, ns: str, image: str, name: str) -> dict[str, float]:
    """One sandbox's start-up as seen on the node (see the module docstring)."""
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": name, "labels": {LABEL_SANDBOX: "true"}},
            "spec": {
                "nodeSelector": {NODE_KIND_LABEL: "real"},
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": image, "command": ["sleep", "3600"]}],
            },
        },
    )
    try:
        deadline = time.monotonic() + 180
        ip = uid = None
        while ip is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"pod {ns}/{name} got no IP in time")
            pod = core.read_namespaced_pod(name, ns)
            ip, uid = pod.status.pod_ip, pod.metadata.uid
            if ip is None:
                time.sleep(0.05)
        while not _healthz(ip):  # polled from the host, as fast as it answers
            if time.monotonic() > deadline:
                raise RuntimeError(f"the daemon of {ns}/{name} did not answer /healthz")
            time.sleep(0.002)
        ok_at = _boottime_s()
        pid = _daemon_pid(uid)
        if pid is None:
            raise RuntimeError(f"no daemon process of pod {uid} on this host")

        cpu_ms, _ = _proc_cpu_rss(pid)
        cg = ContainerCgroup(pid)
        cg_cpu_ms = cg.cpu_ms()
        started = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        start_ms = (ok_at - started / os.sysconf("SC_CLK_TCK")) * 1000
        time.sleep(2.0)  # idle: what a held sandbox costs
        _, rss = _proc_cpu_rss(pid)
        memory = cg.memory_mib()
        sandman = Path(f"/proc/{pid}/root{DAEMON_DIR}")
        disk = sum(
            p.lstat().st_size for p in sandman.rglob("*") if p.is_file() and not p.is_symlink()
        )
        return {
            "start_ms": start_ms,
            "cpu_ms": cpu_ms,
            "cgroup_cpu_ms": cg_cpu_ms,
            "rss_mib": rss,
            "cgroup_memory_mib": memory,
            "disk_mb": disk / 1e6,
        }
    finally:
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def pod_starts(core: CoreV1Api, ns: str, image: str, runs: int) -> dict[str, Any]:
    pod_start(core, ns, image, "warm")  # pulls and caches: not counted
    got = [pod_start(core, ns, image, f"start-{i}") for i in range(runs)]

    def med(k: str) -> float:
        return statistics.median(g[k] for g in got)

    return {
        "node_daemon_start_ms": med("start_ms"),
        "node_daemon_start_ms_min": min(g["start_ms"] for g in got),
        "node_daemon_start_cpu_ms": med("cpu_ms"),
        "node_container_start_cpu_ms": med("cgroup_cpu_ms"),
        "node_daemon_rss_mib": med("rss_mib"),
        "node_container_memory_mib": med("cgroup_memory_mib"),
        "node_daemon_disk_mb": med("disk_mb"),
        "node_pod_starts": runs,
    }


def node_comparison(args: argparse.Namespace, local: dict[str, Any]) -> dict[str, Any]:
    bed = bench_bed(need_real_node=True)
    try:
        cluster = bed.cluster
        node = cluster.real_node
        assert node is not None
        tiny = ImageBuilder(cluster.config.cache_dir).build_and_push("tiny", node.registry).ref
        core = CoreV1Api(api_client(cluster.kubeconfig))
        ns = f"bench-daemon-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": ns}})
        try:
            starts = pod_starts(core, ns, tiny, args.pod_starts)
            starts["node_load_avg_1m"] = round(os.getloadavg()[0], 2)
            got = asyncio.run(_sdk_and_http(str(cluster.kubeconfig), ns, tiny))
            kubectl = [
                str(cluster.binaries.kubectl),
                f"--kubeconfig={cluster.kubeconfig}",
                "-n",
                ns,
                "exec",
                got["name"],
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
    node_p50 = percentile(got["http"], 50)
    sdk_p50 = percentile(got["sdk"], 50)
    kube_p50 = percentile(kube_lat, 50)
    return {
        **starts,
        "node_exec_p50_ms": node_p50,
        "node_exec_p99_ms": percentile(got["http"], 99),
        "sdk_exec_p50_ms": sdk_p50,
        "sdk_exec_p99_ms": percentile(got["sdk"], 99),
        "kubectl_exec_p50_ms": kube_p50,
        "kubectl_exec_p99_ms": percentile(kube_lat, 99),
        "kubectl_vs_daemon_ratio": kube_p50 / node_p50,
        "sdk_vs_kubectl_exec_ratio": kube_p50 / sdk_p50,
        "sandbox_ttfc_s": got["ttfc_s"],
    }
