"""`sandman bench daemon`: the in-sandbox daemon's speed.

Local (loopback, no cluster): exec round trip of `true` sequentially and with
64 in flight, file write+read throughput (1 MB and 100 MB), and the frozen
executable's start -> first /healthz. On the real node (when a cluster with
one runs or can be started): exec through the daemon in a pod vs `kubectl
exec` of the same command in the same pod, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import secrets
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
        help="bench `python -m sandman.daemon` instead of the frozen executable",
    )
    p.add_argument("--no-node", action="store_true", help="skip the real-node comparison")
    p.add_argument("--kubectl-execs", type=int, default=20)


def _daemon_argv(frozen: Path | None) -> list[str]:
    return [str(frozen)] if frozen else [sys.executable, "-m", "sandman.daemon"]


async def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> float:
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as http:
        while time.monotonic() - t0 < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {proc.returncode}")
            try:
                async with http.get(url + "/healthz") as r:
                    if r.status == 200:
                        return (time.monotonic() - t0) * 1000
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.005)
    raise RuntimeError("daemon not healthy in time")


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


async def _local(args: argparse.Namespace, frozen: Path | None) -> dict[str, Any]:
    token = secrets.token_hex(16)
    digest = hashlib.sha256(token.encode()).hexdigest()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="sandman-bench-daemon-") as tmp:
        root = Path(tmp)
        (root / "d").mkdir()
        (root / "t").mkdir()
        argv = [
            *_daemon_argv(frozen),
            "serve",
            f"--listen=127.0.0.1:{port}",
            f"--daemon-dir={root / 'd'}",
            f"--temp-dir={root / 't'}",
        ]
        env = {**os.environ, "SANDMAN_TOKEN_SHA256": digest, "TMPDIR": str(root / "d")}
        startups = []
        for _ in range(5 if frozen else 1):
            proc = subprocess.Popen(
                argv, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                startups.append(await _wait_healthy(url, proc))
            finally:
                proc.terminate()
                proc.wait(10)
        proc = subprocess.Popen(
            argv, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            await _wait_healthy(url, proc)
            seq = await exec_latencies(url, token, args.execs)
            conc = await exec_latencies(url, token, args.concurrent_execs, args.concurrency)
            mb1 = await file_throughput(url, token, 1 << 20, 20, root)
            mb100 = await file_throughput(url, token, 100 << 20, 2, root)
        finally:
            proc.terminate()
            proc.wait(10)
    return {
        "daemon": "frozen" if frozen else "python",
        "exec_p50_ms": percentile(seq, 50),
        "exec_p99_ms": percentile(seq, 99),
        "exec_concurrent_p50_ms": percentile(conc, 50),
        "exec_concurrent_p99_ms": percentile(conc, 99),
        "exec_concurrent_per_s": len(conc) / (sum(conc) / 1000 / args.concurrency),
        "file_1mb_mb_per_s": mb1,
        "file_100mb_mb_per_s": mb100,
        "startup_ms": statistics.median(startups),
        "startup_runs": len(startups),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    frozen = None
    if not args.python:
        from sandman.harness.cluster.config import default_cache_dir
        from sandman.harness.images.daemon_binary import ensure_daemon_binary

        frozen = ensure_daemon_binary(default_cache_dir(), lambda m: print(m, file=sys.stderr))
    results = asyncio.run(_local(args, frozen))
    if not args.no_node:
        from sandman.bench.daemon_node import node_comparison

        results.update(node_comparison(args, results))
    print(table("sandmand", [(k, v) for k, v in results.items()]))
    return results
