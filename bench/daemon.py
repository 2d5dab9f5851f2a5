"""`sandman bench daemon`: the in-sandbox daemon's start-up, footprint and speed.

Local (loopback, no cluster): the runtime tree's cold start as PID 1 of a
busybox-only rootfs (wall and CPU to the first /healthz, idle RSS, disk per
pod), exec round trip of `true` sequentially and with 64 in flight, SWE-ReX's
server beside it in the same run, file write+read throughput (1 MB and
100 MB). On the real node (when a cluster with one runs or can be started):
the same start-up figures from inside a pod, and exec through the daemon vs
`kubectl exec` of the same command in the same pod.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from sandman.bench.report import percentile, table
from sandman.harness.testing import free_port


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--execs", type=int, default=1000, help="sequential exec calls")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--concurrent-execs", type=int, default=2000)
    p.add_argument(
        "--python",
        action="store_true",
        help="bench `python -m sandman.daemon` from the dev venv instead of the runtime tree",
    )
    p.add_argument("--starts", type=int, default=10, help="cold starts measured")
    p.add_argument("--no-swerex", action="store_true", help="skip SWE-ReX's server")
    p.add_argument("--no-node", action="store_true", help="skip the real-node comparison")
    p.add_argument("--kubectl-execs", type=int, default=20)


def _daemon_argv(tree: Path | None) -> list[str]:
    if tree is None:
        return [sys.executable, "-m", "sandman.daemon"]
    from sandman.harness.images.daemon_binary import host_argv

    return host_argv(tree)


def _healthz_ok(port: int) -> bool:
    """One raw GET /healthz (no client library in the timing loop)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def _proc_cpu_rss(pid: int) -> tuple[float, float]:
    """(CPU ms so far, resident MiB) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu_ms = (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")
    rss_kb = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return cpu_ms, rss_kb / 1024


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _busybox_root(root: Path, tree: Path) -> None:
    """A rootfs of busybox-static and the daemon tree only (no libc, no /tmp)."""
    (root / "bin").mkdir(parents=True)
    shutil.copy2("/bin/busybox", root / "bin" / "busybox")
    for applet in ("sh", "true", "cat", "ls", "sleep"):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "proc").mkdir()
    (root / ".sandman").mkdir()
    shutil.copytree(tree / "rt", root / ".sandman" / "rt", symlinks=True)


def measure_starts(tree: Path, runs: int, digest: str) -> dict[str, Any]:
    """Cold start -> first /healthz 200 of the tree as PID 1 of a busybox-only rootfs
    (unshare --pid --mount-proc + chroot, as a container runtime would run it):
    wall, the daemon's CPU at that moment, its idle RSS, and the disk it takes."""
    from sandman.harness.images.daemon_binary import serve_argv, tree_size

    unshare, chroot = shutil.which("unshare"), shutil.which("chroot")
    if os.geteuid() != 0 or not unshare or not chroot or not Path("/bin/busybox").exists():
        raise RuntimeError("start-up bench needs root, unshare, chroot and /bin/busybox")
    walls, cpus, rss = [], [], []
    with tempfile.TemporaryDirectory(prefix="sandman-bench-root-") as tmp:
        root = Path(tmp) / "root"
        _busybox_root(root, tree)
        for i in range(runs):
            port = free_port()
            argv = [unshare, "--pid", "--fork", f"--mount-proc={root}/proc", chroot, str(root)]
            argv += [*serve_argv(), "serve", f"--listen=127.0.0.1:{port}"]
            env = {"PATH": "/bin", "SANDMAN_TOKEN_SHA256": digest}
            t0 = time.monotonic()
            proc = subprocess.Popen(
                argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                while not _healthz_ok(port):
                    if proc.poll() is not None or time.monotonic() - t0 > 30:
                        raise RuntimeError(f"the daemon did not start (exit {proc.returncode})")
                    time.sleep(0.002)
                walls.append((time.monotonic() - t0) * 1000)
                pid = _children(proc.pid)[0]  # the namespace's PID 1: the daemon
                cpus.append(_proc_cpu_rss(pid)[0])
                if i == 0:
                    time.sleep(2.0)  # idle: what a held sandbox costs
                    rss.append(_proc_cpu_rss(pid)[1])
                os.kill(pid, signal.SIGTERM)
                proc.wait(10)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    return {
        "daemon_start_ms": statistics.median(walls),
        "daemon_start_ms_min": min(walls),
        "daemon_start_cpu_ms": statistics.median(cpus),
        "daemon_rss_mib": rss[0],
        # Per pod: the copied tree; with the shared node directory, a symlink.
        "daemon_disk_mb": tree_size(tree) / 1e6,
        "daemon_disk_mb_shared": 0.0,
        "daemon_starts": runs,
    }


async def exec_latencies(url: str, token: str, n: int, concurrency: int = 1) -> list[float]:
    headers = {"Authorization": f"Bearer {token}"}
    out: list[float] = []
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn, headers=headers) as http:
        sem = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with sem:
                t = time.perf_counter()
                async with http.post(url + "/v1/exec", json={"cmd": ["true"]}) as r:
                    doc = await r.json()
                out.append((time.perf_counter() - t) * 1000)
                if doc.get("exit_code") != 0:
                    raise RuntimeError(f"exec failed: {doc}")

        for _ in range(min(20, n)):  # warm the connections
            await one()
        out.clear()
        await asyncio.gather(*(one() for _ in range(n)))
    return out


async def file_throughput(url: str, token: str, size: int, reps: int, root: Path) -> float:
    """MB/s for write+read of ``size`` bytes (both directions counted)."""
    headers = {"Authorization": f"Bearer {token}"}
    data = os.urandom(size)
    path = root / f"bench-{size}"
    async with aiohttp.ClientSession(headers=headers) as http:
        t0 = time.perf_counter()
        for _ in range(reps):
            async with http.put(url + f"/v1/files?path={path}", data=data) as r:
                assert r.status == 201, await r.text()
            async with http.get(url + f"/v1/files?path={path}") as r:
                got = await r.read()
                assert len(got) == size
        elapsed = time.perf_counter() - t0
    path.unlink(missing_ok=True)
    return 2 * size * reps / elapsed / 1e6


async def _wait_port(port: int, proc: subprocess.Popen[bytes], path: str, timeout: float = 60):
    async with aiohttp.ClientSession() as http:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                async with http.get(f"http://127.0.0.1:{port}{path}") as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.02)
    raise RuntimeError(f"nothing answered on port {port} in time")


async def swerex_latencies(n: int) -> list[float]:
    """SWE-ReX's server (`swerex-remote`, pinned in the [swerex] extra): POST
    /execute of `true`, sequential, over one keep-alive connection: the same
    client loop as for sandmand, so the two figures compare servers only."""
    exe = Path(sys.executable).with_name("swerex-remote")
    if not exe.exists():
        raise RuntimeError("swerex-remote not installed: pip install -e '.[swerex]'")
    port, token = free_port(), secrets.token_hex(8)
    proc = subprocess.Popen(
        [str(exe), "--host", "127.0.0.1", "--port", str(port), "--auth-token", token],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await _wait_port(port, proc, "/is_alive")
        out: list[float] = []
        headers = {"X-API-Key": token}
        async with aiohttp.ClientSession(headers=headers) as http:
            for i in range(n + 20):
                t = time.perf_counter()
                async with http.post(
                    f"http://127.0.0.1:{port}/execute", json={"command": ["true"]}
                ) as r:
                    doc = await r.json()
                if i >= 20:  # the first calls warm the connection
                    out.append((time.perf_counter() - t) * 1000)
                if doc.get("exit_code") != 0:
                    raise RuntimeError(f"swerex execute failed: {doc}")
        return out
    finally:
        proc.terminate()
        proc.wait(10)


async def _local(args: argparse.Namespace, tree: Path | None) -> dict[str, Any]:
    token = secrets.token_hex(16)
    digest = hashlib.sha256(token.encode()).hexdigest()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {"daemon": "tree" if tree else "python"}
    if tree is not None:
        out.update(measure_starts(tree, args.starts, digest))
    with tempfile.TemporaryDirectory(prefix="sandman-bench-daemon-") as tmp:
        root = Path(tmp)
        (root / "d").mkdir()
        (root / "t").mkdir()
        argv = [
            *_daemon_argv(tree),
            "serve",
            f"--listen=127.0.0.1:{port}",
            f"--daemon-dir={root / 'd'}",
            f"--temp-dir={root / 't'}",
        ]
        env = {**os.environ, "SANDMAN_TOKEN_SHA256": digest}
        proc = subprocess.Popen(
            argv, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            await _wait_port(port, proc, "/healthz")
            seq = await exec_latencies(url, token, args.execs)
            if not args.no_swerex:
                rex = await swerex_latencies(min(args.execs, 300))
                # Ours again right after, so load changes between the two show.
                seq2 = await exec_latencies(url, token, min(args.execs, 300))
                out["swerex_exec_p50_ms"] = percentile(rex, 50)
                out["swerex_exec_p99_ms"] = percentile(rex, 99)
                out["exec_p50_ms_beside_swerex"] = percentile(seq2, 50)
                out["swerex_vs_daemon_ratio"] = percentile(rex, 50) / percentile(seq2, 50)
            conc = await exec_latencies(url, token, args.concurrent_execs, args.concurrency)
            mb1 = await file_throughput(url, token, 1 << 20, 20, root)
            mb100 = await file_throughput(url, token, 100 << 20, 2, root)
        finally:
            proc.terminate()
            proc.wait(10)
    out.update(
        {
            "exec_p50_ms": percentile(seq, 50),
            "exec_p99_ms": percentile(seq, 99),
            "exec_concurrent_p50_ms": percentile(conc, 50),
            "exec_concurrent_p99_ms": percentile(conc, 99),
            "exec_concurrent_per_s": len(conc) / (sum(conc) / 1000 / args.concurrency),
            "file_1mb_mb_per_s": mb1,
            "file_100mb_mb_per_s": mb100,
            "load_avg_1m": os.getloadavg()[0],
        }
    )
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    tree = None
    if not args.python:
        from sandman.harness.cluster.config import default_cache_dir
        from sandman.harness.images.daemon_binary import ensure_daemon_tree

        tree = ensure_daemon_tree(default_cache_dir(), lambda m: print(m, file=sys.stderr))
    results = asyncio.run(_local(args, tree))
    if not args.no_node:
        from sandman.bench.daemon_node import node_comparison

        results.update(node_comparison(args, results))
    print(table("sandmand", [(k, v) for k, v in results.items()]))
    return results
