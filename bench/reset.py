"""`sandman bench reset`: what the pristine record and /v1/reset cost.

Local (loopback, no cluster): the daemon's runtime tree on the host, given a
synthetic git workspace (``--files`` files, ``--mb`` MB in all, one commit,
optionally packed) and optionally a Python tree to verify (``--python-dir``).
Measured: start to the first /healthz (the record is taken before the daemon
listens), the record's size on disk, RSS after start; then a rollout's worth
of changes (``--touched`` files edited, as many added, a commit) and the
reset that undoes them, a reset with nothing to undo, and RSS after.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from sandman.bench.report import table
from sandman.harness.testing import free_port


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--files", type=int, default=6000, help="files in the workspace")
    p.add_argument("--mb", type=float, default=60.0, help="workspace size (MB, all files)")
    p.add_argument("--touched", type=int, default=50, help="files the rollout edits")
    p.add_argument("--packed", action="store_true", help="git gc the workspace first")
    p.add_argument("--python-dir", type=Path, default=None, help="a Python tree to verify too")
    p.add_argument("--resets", type=int, default=5, help="resets after rollouts (median)")


def _git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b"}
    env |= {"GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def _workspace(root: Path, files: int, mb: float, packed: bool) -> Path:
    ws = root / "ws"
    ws.mkdir()
    _git(ws, "init", "-q", "-b", "main")
    size = max(1, int(mb * 1e6 / files))
    for i in range(files):
        d = ws / f"pkg{i % 50}" / f"mod{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        # Text that compresses like source code, distinct per file.
        line = f"def f_{i}(x):  # {secrets.token_hex(8)}\n    return x + {i}\n"
        (d / f"f{i}.py").write_text((line * (size // len(line) + 1))[:size])
    _git(ws, "add", "-A")
    _git(ws, "commit", "-qm", "pristine")
    if packed:
        _git(ws, "gc", "-q")
    return ws


def _call(port: int, token: str, method: str, path: str) -> Any:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    from sandman.harness.cluster.config import default_cache_dir
    from sandman.harness.images.daemon_binary import ensure_daemon_tree, host_argv

    tree = ensure_daemon_tree(default_cache_dir())
    with tempfile.TemporaryDirectory(prefix="sandman-bench-reset-") as tmp:
        root = Path(tmp)
        ws = _workspace(root, args.files, args.mb, args.packed)
        (root / "d").mkdir()
        token = secrets.token_hex(16)
        port = free_port()
        argv = [
            *host_argv(tree),
            "serve",
            f"--listen=127.0.0.1:{port}",
            f"--token-sha256={hashlib.sha256(token.encode()).hexdigest()}",
            f"--daemon-dir={root / 'd'}",
            f"--workspace={ws}",
            f"--temp-dir={root / 'tmp'}",
            f"--python-dirs={args.python_dir or 'none'}",
        ]
        (root / "tmp").mkdir()
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
                    break
                except OSError:
                    if proc.poll() is not None:
                        raise RuntimeError("the daemon exited") from None
                    time.sleep(0.01)
            start_ms = (time.monotonic() - t0) * 1000
            rss_start = _rss_mib(proc.pid)
            record_kb = (root / "d" / "pristine.rec").stat().st_size / 1024
            first = _call(port, token, "POST", "/v1/reset")  # waits for deferred hashing
            idle_ms = []
            undo_ms = []
            for r in range(args.resets):
                files = sorted(ws.rglob("*.py"))[: args.touched]
                for i, f in enumerate(files):
                    f.write_text(f"edited {r} {i}\n")
                    (f.parent / f"new_{r}_{i}.py").write_text("x = 1\n")
                _git(ws, "add", "-A")
                # In a sandbox, reset kills a detached auto-gc with everything
                # else; run from here, it must finish before the reset starts.
                _git(ws, "-c", "gc.autoDetach=false", "commit", "-qm", f"rollout {r}")
                rep = _call(port, token, "POST", "/v1/reset")
                assert rep["clean"], rep
                undo_ms.append(rep["duration_ms"])
                rep = _call(port, token, "POST", "/v1/reset")
                assert rep["clean"], rep
                idle_ms.append(rep["duration_ms"])
            rss_after = _rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)
    undo_ms.sort()
    idle_ms.sort()
    results = {
        "workspace_files": args.files,
        "workspace_mb": args.mb,
        "packed": args.packed,
        "python_dir": str(args.python_dir) if args.python_dir else None,
        "start_to_healthz_ms": round(start_ms, 1),
        "record_kb_on_disk": round(record_kb, 1),
        "rss_mib_after_start": round(rss_start, 1),
        "first_reset_ms": round(first["duration_ms"], 1),
        "reset_after_rollout_ms_median": round(undo_ms[len(undo_ms) // 2], 1),
        "reset_nothing_to_do_ms_median": round(idle_ms[len(idle_ms) // 2], 1),
        "rss_mib_after_resets": round(rss_after, 1),
        "touched_files": args.touched,
    }
    print(table("pristine record and reset", list(results.items())))
    return results
