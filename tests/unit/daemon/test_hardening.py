"""Daemon hardening (idle figure, bounded streaming, OOM preference, FIFOs) and
its flags (exit with the command, no reset, readiness), against a real daemon.

Each test here fails on the daemon before these fixes: the idle figure moved
only when a request started, streamed exec buffered without bound, children
shared the daemon's oom_score_adj, and opening a FIFO froze the event loop.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.unit.daemon.helpers import Daemon, start_daemon, stop_daemon

pytestmark = pytest.mark.daemon_process

# Generous bounds for a loaded 2-core CI machine; each wait ends as soon as
# its condition holds.
WAIT_S = 20.0


def wait_for(cond, what: str, timeout: float = WAIT_S):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_request_in_flight_is_activity(daemon: Daemon) -> None:
    # The idle figure is open (the reaper needs no token) and says nothing else.
    status, doc = daemon.request("GET", "/v1/idle", token="")
    assert status == 200 and set(doc) == {"idle_s"}
    done = threading.Event()
    threading.Thread(target=lambda: (daemon.exec(["sleep", "3"]), done.set()), daemon=True).start()
    wait_for(lambda: daemon.ok("GET", "/v1/status")["requests_in_flight"] == 1, "the exec")
    # The old daemon counted only the start of a request: a long exec looked idle.
    st = daemon.ok("GET", "/v1/status")
    assert st["idle_s"] == 0 and daemon.ok("GET", "/v1/idle", token="")["idle_s"] == 0
    wait_for(done.is_set, "the exec to end")
    assert daemon.ok("GET", "/v1/status")["requests_in_flight"] == 0


def test_running_background_processes_count_unless_told_otherwise(daemon: Daemon) -> None:
    busy = daemon.ok("POST", "/v1/processes", {"cmd": ["sleep", "30"]})
    assert busy["keeps_active"] is True
    wait_for(lambda: daemon.ok("GET", "/v1/status")["background_keeps_active"], "busy flag")
    assert daemon.ok("GET", "/v1/status")["idle_s"] == 0
    daemon.ok("DELETE", f"/v1/processes/{busy['id']}")
    quiet = daemon.ok("POST", "/v1/processes", {"cmd": ["sleep", "30"], "keeps_active": False})
    assert quiet["keeps_active"] is False
    # With only a process that does not count, idle time passes again.
    wait_for(lambda: daemon.ok("GET", "/v1/status")["idle_s"] > 0.05, "idle time to pass")
    status, doc = daemon.request("POST", "/v1/processes", {"cmd": ["true"], "keeps_active": 1})
    assert status == 400 and "keeps_active" in doc["error"]["message"]


def test_streamed_exec_reads_only_as_fast_as_the_client(daemon: Daemon) -> None:
    """A client that stops reading `yes` must not grow the daemon (old: an unbounded queue)."""
    body = json.dumps({"cmd": ["yes", "x" * 200], "timeout_s": 60}).encode()
    s = socket.create_connection(("127.0.0.1", daemon.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        s.sendall(
            b"POST /v1/exec?stream=1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {daemon.token}\r\n".encode()
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert s.recv(1024).startswith(b"HTTP/1.1 200")
        start = rss_mib(daemon.proc.pid)
        # Not reading: `yes` would produce GB/s. Samples over ~2 s must stay flat.
        samples = []
        for _ in range(10):
            time.sleep(0.2)
            samples.append(rss_mib(daemon.proc.pid))
        assert max(samples) - start < 32, (start, samples)
        assert daemon.request("GET", "/healthz")[0] == 200
    finally:
        s.close()


def test_children_are_killed_by_the_oom_killer_before_the_daemon(daemon: Daemon) -> None:
    own = int(Path(f"/proc/{daemon.proc.pid}/oom_score_adj").read_text())
    got = int(daemon.exec(["cat", "/proc/self/oom_score_adj"])["stdout"])
    assert got == min(1000, own + 500)


def test_a_fifo_never_freezes_the_daemon(daemon: Daemon, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # Old: open() of a FIFO without a writer blocked the event loop for good.
    status, doc = daemon.request("GET", f"/v1/files?path={fifo}", timeout=10)
    assert (status, doc["error"]["code"]) == (400, "not_a_file")
    status, doc = daemon.request("PUT", f"/v1/files?path={fifo}&append=1", raw=b"x", timeout=10)
    assert (status, doc["error"]["code"]) == (400, "not_a_file")
    assert daemon.request("GET", "/healthz", timeout=5)[0] == 200


def test_exit_with_command_answers_in_flight_then_exits_with_its_code(tmp_path: Path) -> None:
    flag = tmp_path / "go"
    d = start_daemon(
        tmp_path,
        "--exit-with-command",
        "--",
        "sh",
        "-c",
        f"while [ ! -e {flag} ]; do sleep 0.05; done; exit 7",
    )
    try:
        result: dict[str, object] = {}
        t = threading.Thread(
            target=lambda: result.update(d.exec(f"touch {flag}; sleep 0.5; echo done")),
            daemon=True,
        )
        t.start()
        assert d.proc.wait(WAIT_S) == 7
        t.join(WAIT_S)
        # The request in flight when the command ended was answered in full.
        assert result.get("stdout") == "done\n", result
    finally:
        stop_daemon(d)


def test_no_reset_refuses_reset(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, "--no-reset")
    try:
        status, doc = d.request("POST", "/v1/reset")
        assert status == 409 and doc["error"]["code"] == "reset_disabled"
        assert "eval" in doc["error"]["message"]
    finally:
        stop_daemon(d)


def test_readyz_combines_the_daemon_and_the_original_probe(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    # periodSeconds 1: /readyz keeps an outcome for the probe's period.
    probe = json.dumps({"exec": {"command": ["test", "-e", str(ready)]}, "periodSeconds": 1})
    d = start_daemon(tmp_path, f"--readiness-probe={probe}")
    try:
        assert d.request("GET", "/healthz", token="")[0] == 200
        status, doc = d.request("GET", "/readyz", token="")
        assert status == 503 and doc["ready"] is False
        ready.touch()
        time.sleep(1.05)
        status, doc = d.request("GET", "/readyz", token="")
        assert status == 200 and doc["ready"] is True
    finally:
        stop_daemon(d)
    d = start_daemon(tmp_path / "plain")
    try:
        assert d.request("GET", "/readyz", token="") == (200, {"ready": True})
    finally:
        stop_daemon(d)


def test_a_bad_readiness_probe_is_a_usage_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    for bad in ('{"grpc": {"port": 1}}', '{"tcpSocket": {"port": "http"}}', "nope"):
        proc = subprocess.run(
            [sys.executable, "-m", "sandman.daemon", "serve", f"--readiness-probe={bad}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and "--readiness-probe" in proc.stderr, proc.stderr
