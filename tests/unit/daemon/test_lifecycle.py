"""SIGTERM handling and the supervised original command."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.unit.daemon.helpers import start_daemon

pytestmark = pytest.mark.daemon_process


def test_sigterm_stops_children_gracefully_then_kills(tmp_path: Path) -> None:
    marker = tmp_path / "got-term"
    cmd = f"trap 'echo yes > {marker}; exit 0' TERM; while :; do sleep 0.05; done"
    d = start_daemon(tmp_path, "--", "sh", "-c", cmd)
    status = d.ok("GET", "/v1/status")["command"]
    assert status["running"] is True and status["cmd"][:2] == ["sh", "-c"]
    stubborn = d.ok("POST", "/v1/processes", {"cmd": "trap '' TERM; sleep 300"})
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    code = d.proc.wait(15)
    elapsed = time.monotonic() - t0
    assert marker.read_text() == "yes\n"  # the original command saw SIGTERM
    assert code == 0  # ... and its exit code is the daemon's
    assert 1.5 < elapsed < 10  # waited out the 2 s grace for the stubborn one
    assert not Path(f"/proc/{stubborn['pid']}").exists() or _zombie(stubborn["pid"])


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_exit_code_of_supervised_command_propagates(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, "--", "sh", "-c", "exit 5")
    deadline = time.monotonic() + 5
    while d.ok("GET", "/v1/status")["command"]["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    info = d.ok("GET", "/v1/status")["command"]
    assert (info["running"], info["exit_code"]) == (False, 5)
    assert d.exec(["true"])["exit_code"] == 0  # the sandbox keeps serving
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(10) == 5


def test_bad_token_hash_is_refused_at_start(tmp_path: Path) -> None:
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "sandman.daemon", "serve", "--token-sha256", "nothex"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "64 hex characters" in proc.stderr
