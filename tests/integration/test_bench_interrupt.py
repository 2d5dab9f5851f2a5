"""`sandman bench` stopped by SIGTERM (e.g. under `timeout`) tears down the
private cluster it started: no etcd, apiserver or kwok of it is left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandman.harness.cluster.process import ManagedProcess
from sandman.harness.cluster.running import BESIDE_ENV
from sandman.harness.testing import cluster_unavailable_reason
from tests.procs import processes_mentioning


def wait_for_text(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    pytest.fail(f"no {text!r} in the bench's output:\n{path.read_text(errors='replace')[-3000:]}")


def test_sigterm_during_bench_tears_down_its_cluster(tmp_path: Path) -> None:
    reason = cluster_unavailable_reason()
    if reason:
        pytest.skip(reason)
    # The bench's private state dir is made under TMPDIR: every process of its
    # cluster names a path under `scratch`, nothing else does.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = tmp_path / "bench.out"
    # Other clusters' load does not matter here: nothing is measured.
    env = dict(os.environ, TMPDIR=str(scratch), SANDMAN_TEST_REAL_NODE="0")
    env[BESIDE_ENV] = "1"
    env.pop("SANDMAN_TEST_CLUSTER", None)
    argv = [sys.executable, "-m", "sandman.cli.main", "bench", "cluster"]
    argv += ["--pods", "5", "--kwok-nodes", "1"]
    with open(out, "wb") as f:
        bench = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for_text(out, "healthy", bench, timeout=90)  # etcd, the first to start
        ours = processes_mentioning(str(scratch))
        assert "etcd" in {Path(c).name for c in ours.values()}, ours
        bench.send_signal(signal.SIGTERM)
        rc = bench.wait(timeout=60)
        log = out.read_text(errors="replace")
        left = processes_mentioning(str(scratch))
        assert not left, f"left running after SIGTERM: {left}\n{log[-3000:]}"
        assert rc != 0, log
        assert "interrupted by SIGTERM" in log, log
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        # Whatever the old behaviour left behind: stop it through its pid files.
        for pid_file in scratch.glob("**/run/*.pid"):
            ManagedProcess(pid_file.stem, (), pid_file.parent, pid_file.parent).stop()
