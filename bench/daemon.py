"""`sandman bench daemon`: the in-sandbox daemon's start-up, footprint and speed.

Local (loopback, no cluster): the runtime tree's cold start as PID 1 of a
busybox-only rootfs (wall and CPU to the first /healthz, idle RSS, disk per
pod), exec round trip of `true` sequentially and with 64 in flight, SWE-ReX's
server beside it in the same run, file write+read throughput (1 MB and
100 MB). Beside ours, in the same run and harness: a minimal compiled daemon
(bench/compiled_daemon, Go: /healthz and /v1/exec only) for the Python vs
compiled trade-off, and the floor under an exec (spawning `true` and waiting
for it, no server). On the real node (when a cluster with one runs or can be
started): the same start-up figures from inside pods (bench/daemon_node.py),
and exec through the daemon vs `kubectl exec` of the same command.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from collections.abc import Callable
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
    p.add_argument(
        "--no-compiled",
        dest="compiled",
        action="store_false",
        help="skip the minimal compiled (Go) daemon measured beside ours",
    )
    p.add_argument("--pod-starts", type=int, default=5, help="sandboxes started on the real node")


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
    """(CPU ms so far, resident MiB) of a process, from /proc.

    CPU is the scheduler's nanosecond count summed over the process's threads
    (/proc/PID/task/*/schedstat), not utime+stime, whose 10 ms ticks would
    show a compiled daemon's start as 0 or 10 ms."""
    cpu_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            cpu_ns += int((task / "schedstat").read_text().split()[0])
    cpu_ms = cpu_ns / 1e6
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


def _busybox_root(root: Path) -> None:
    """A rootfs of busybox-static only (no libc, no /tmp); the daemon goes to /.sandman."""
    (root / "bin").mkdir(parents=True)
    shutil.copy2("/bin/busybox", root / "bin" / "busybox")
    for applet in ("sh", "true", "cat", "ls", "sleep"):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "proc").mkdir()
    (root / ".sandman").mkdir()


def measure_starts(tree: Path, runs: int, digest: str) -> dict[str, Any]:
    """Cold start -> first /healthz 200 of the tree as PID 1 of a busybox-only rootfs
    (unshare --pid --mount-proc + chroot, as a container runtime would run it):
    wall, the daemon's CPU at that moment, its idle RSS, and the disk it takes."""
    from sandman.harness.images.daemon_binary import serve_argv, tree_size

    def place(root: Path) -> None:
        shutil.copytree(tree / "rt", root / ".sandman" / "rt", symlinks=True)

    out = _cold_starts(place, [*serve_argv(), "serve"], runs, digest)
    return {
        "daemon_start_ms": out["start_ms"],
        "daemon_start_ms_min": out["start_ms_min"],
        "daemon_start_cpu_ms": out["start_cpu_ms"],
        "daemon_rss_mib": out["rss_mib"],
        # Per pod: the copied tree; with the shared node directory, a symlink.
        "daemon_disk_mb": tree_size(tree) / 1e6,
        "daemon_disk_mb_shared": 0.0,
        "daemon_starts": runs,
    }


def _cold_starts(
    place: Callable[[Path], None], serve: list[str], runs: int, digest: str
) -> dict[str, float]:
    """``runs`` cold starts of ``serve --listen=...`` as PID 1 of a busybox-only
    rootfs that ``place`` put the daemon into: median wall and CPU to the first
    /healthz 200, and the idle RSS of the first."""
    unshare, chroot = shutil.which("unshare"), shutil.which("chroot")
    if os.geteuid() != 0 or not unshare or not chroot or not Path("/bin/busybox").exists():
        raise RuntimeError("start-up bench needs root, unshare, chroot and /bin/busybox")
    walls, cpus, rss = [], [], []
    with tempfile.TemporaryDirectory(prefix="sandman-bench-root-") as tmp:
        root = Path(tmp) / "root"
        _busybox_root(root)
        place(root)
        for i in range(runs):
            port = free_port()
            argv = [unshare, "--pid", "--fork", f"--mount-proc={root}/proc", chroot, str(root)]
            argv += [*serve, f"--listen=127.0.0.1:{port}"]
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
        "start_ms": statistics.median(walls),
        "start_ms_min": min(walls),
        "start_cpu_ms": statistics.median(cpus),
        "rss_mib": rss[0],
    }


# -- a compiled daemon, for the trade-off ---------------------------------------------
COMPILED_SRC = Path(__file__).resolve().parent / "compiled_daemon"


def build_compiled_daemon(cache_dir: Path) -> Path:
    """The minimal Go daemon (bench/compiled_daemon), static, cached by source hash."""
    h = hashlib.sha256()
    for f in sorted(COMPILED_SRC.glob("*")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    out = cache_dir / "bench" / f"minidaemon-{h.hexdigest()[:16]}"
    if out.exists():
        return out
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("the compiled daemon needs Go on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    subprocess.run(
        [go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp), "."],
        cwd=COMPILED_SRC,
        env=env,
        check=True,
        capture_output=True,
    )
    tmp.rename(out)
    return out


def measure_compiled(binary: Path, runs: int, digest: str) -> dict[str, Any]:
    def place(root: Path) -> None:
        shutil.copy2(binary, root / ".sandman" / "minidaemon")

    out = _cold_starts(place, ["/.sandman/minidaemon"], runs, digest)
    return {
        "compiled_daemon_start_ms": out["start_ms"],
        "compiled_daemon_start_ms_min": out["start_ms_min"],
        "compiled_daemon_start_cpu_ms": out["start_cpu_ms"],
        "compiled_daemon_rss_mib": out["rss_mib"],
        "compiled_daemon_disk_mb": binary.stat().st_size / 1e6,
    }


# What it costs to start `true` and wait for it, without any server around it:
# the floor under an exec's latency. Run by the runtime tree's own interpreter.
SPAWN_PROBE = r"""
import os, subprocess, sys, time
n = int(sys.argv[1])
def popen():
    # As the daemon spawns (children.py): pipes, a new session, close_fds.
    p = subprocess.Popen(["true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
    p.stdin.close(); p.stdout.read(); p.stderr.read(); p.stdout.close(); p.stderr.close()
    p.wait()
def spawn():
    pid = os.posix_spawn("/bin/true", ["true"], os.environ, setsid=True)
    os.waitpid(pid, 0)
def forked():
    # A preexec_fn makes _posixsubprocess fork() instead of vfork().
    p = subprocess.Popen(["true"], start_new_session=True, close_fds=True,
                         preexec_fn=lambda: None)
    p.wait()
for name, fn in (("popen", popen), ("posix_spawn", spawn), ("fork", forked)):
    for _ in range(20):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter(); fn(); out.append((time.perf_counter() - t) * 1000)
    out.sort()
    print(name, out[len(out) // 2], out[min(len(out) - 1, int(len(out) * 0.99))])
"""


def spawn_floor(tree: Path | None, n: int) -> dict[str, float]:
    argv = _daemon_argv(tree)[:-2]  # the interpreter, without -m sandman.daemon
    got = subprocess.run(
        [*argv, "-c", SPAWN_PROBE, str(n)],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout.split("\n")
    out = {}
    for line in got:
        if line.strip():
            name, p50, p99 = line.split()
            out[f"spawn_true_{name}_p50_ms"] = float(p50)
            out[f"spawn_true_{name}_p99_ms"] = float(p99)
    return out


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


def raw_latencies(
    port: int, path: str, body: dict[str, Any], headers: dict[str, str], n: int
) -> list[float]:
    """Sequential POSTs over one keep-alive connection with a bare-socket client
    (pre-encoded request, Content-Length framing): what the server costs, with
    ~tens of microseconds of client instead of aiohttp's few hundred."""
    import json as _json

    payload = _json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (head + f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
    out: list[float] = []
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        for i in range(n + 20):
            t = time.perf_counter()
            s.sendall(request)
            while b"\r\n\r\n" not in buf:
                buf += s.recv(65536)
            hdr, _, buf = buf.partition(b"\r\n\r\n")
            status = hdr.split(b" ", 2)[1]
            length = next(
                int(line.split(b":", 1)[1])
                for line in hdr.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(buf) < length:
                buf += s.recv(65536)
            doc, buf = buf[:length], buf[length:]
            if i >= 20:  # the first calls warm the connection
                out.append((time.perf_counter() - t) * 1000)
            if status != b"200" or b'"exit_code": 0' not in doc.replace(
                b'"exit_code":0', b'"exit_code": 0'
            ):
                raise RuntimeError(f"exec failed: {status!r} {doc[:300]!r}")
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


async def swerex_latencies(n: int) -> tuple[list[float], list[float]]:
    """SWE-ReX's server (`swerex-remote`, pinned in the [swerex] extra): POST
    /execute of `true`, sequential, over one keep-alive connection: the same
    client loops as for sandmand (aiohttp, then the bare socket), so the
    figures compare servers only."""
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
        raw = raw_latencies(port, "/execute", {"command": ["true"]}, headers, n)
        return out, raw
    finally:
        proc.terminate()
        proc.wait(10)


async def compiled_exec(
    binary: Path, token: str, digest: str, n: int
) -> tuple[list[float], list[float]]:
    port = free_port()
    proc = subprocess.Popen(
        [str(binary), f"--listen=127.0.0.1:{port}"],
        env={"PATH": "/usr/bin:/bin", "SANDMAN_TOKEN_SHA256": digest},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await _wait_port(port, proc, "/healthz")
        lat = await exec_latencies(f"http://127.0.0.1:{port}", token, n)
        auth = {"Authorization": f"Bearer {token}"}
        return lat, raw_latencies(port, "/v1/exec", {"cmd": ["true"]}, auth, n)
    finally:
        proc.terminate()
        proc.wait(10)


async def _local(args: argparse.Namespace, tree: Path | None) -> dict[str, Any]:
    token = secrets.token_hex(16)
    digest = hashlib.sha256(token.encode()).hexdigest()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {
        "daemon": "tree" if tree else "python",
        "load_avg_1m_start": _load(),
        "machine_cpu_ref_ms": machine_reference(),
    }
    counters = _cpu_counters()
    if tree is not None:
        out.update(measure_starts(tree, args.starts, digest))
    compiled = None
    if args.compiled:
        from sandman.harness.cluster.config import default_cache_dir

        compiled = build_compiled_daemon(default_cache_dir())
        out.update(measure_compiled(compiled, args.starts, digest))
    out.update(spawn_floor(tree, min(args.execs, 500)))
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
            auth = {"Authorization": f"Bearer {token}"}
            seq = await exec_latencies(url, token, args.execs)
            raw = raw_latencies(port, "/v1/exec", {"cmd": ["true"]}, auth, args.execs)
            out["exec_raw_p50_ms"] = percentile(raw, 50)
            out["exec_raw_p99_ms"] = percentile(raw, 99)
            if not args.no_swerex:
                rex, rex_raw = await swerex_latencies(min(args.execs, 300))
                # Ours again right after, so load changes between the two show.
                seq2 = await exec_latencies(url, token, min(args.execs, 300))
                raw2 = raw_latencies(port, "/v1/exec", {"cmd": ["true"]}, auth, 300)
                out["swerex_exec_p50_ms"] = percentile(rex, 50)
                out["swerex_exec_p99_ms"] = percentile(rex, 99)
                out["swerex_exec_raw_p50_ms"] = percentile(rex_raw, 50)
                out["exec_p50_ms_beside_swerex"] = percentile(seq2, 50)
                out["exec_raw_p50_ms_beside_swerex"] = percentile(raw2, 50)
                out["swerex_vs_daemon_ratio"] = percentile(rex, 50) / percentile(seq2, 50)
                out["swerex_vs_daemon_raw_ratio"] = percentile(rex_raw, 50) / percentile(raw2, 50)
            if compiled is not None:
                # Right after ours, with the same client loops.
                comp, comp_raw = await compiled_exec(compiled, token, digest, args.execs)
                out["compiled_exec_p50_ms"] = percentile(comp, 50)
                out["compiled_exec_p99_ms"] = percentile(comp, 99)
                out["compiled_exec_raw_p50_ms"] = percentile(comp_raw, 50)
                out["compiled_exec_raw_p99_ms"] = percentile(comp_raw, 99)
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
            "load_avg_1m": _load(),
            "steal_pct": steal_pct(counters),
        }
    )
    return out


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def machine_reference() -> float:
    """CPU ms of a fixed pure-Python loop (best of 3): how fast this machine
    runs Python right now, to scale CPU figures between runs and machines
    (a 2024 desktop: ~120 ms)."""
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        sum(range(10**7))
        best = min(best, (time.process_time() - t) * 1000)
    return round(best, 1)


def _cpu_counters() -> tuple[int, int]:
    """(steal, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return fields[7], sum(fields)


def steal_pct(since: tuple[int, int]) -> float:
    """Share of CPU time the hypervisor took from this VM since ``since``."""
    now = _cpu_counters()
    total = now[1] - since[1]
    return round(100 * (now[0] - since[0]) / total, 1) if total else 0.0


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
