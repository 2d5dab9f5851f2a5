"""/v1/reset restores a used sandbox, verifies it, and reports what it cannot fix."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.unit.daemon.helpers import Daemon, git, start_daemon, stop_daemon

pytestmark = pytest.mark.daemon_process


def make_workspace(root: Path) -> tuple[Path, str]:
    ws = root / "ws"
    ws.mkdir()
    git(ws, "init", "-q", "-b", "main")
    (ws / "app.py").write_text("print('v1')\n")
    (ws / ".gitignore").write_text("*.log\n")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "pristine")
    return ws, git(ws, "rev-parse", "HEAD").strip()


def test_reset_restores_files_git_processes_and_temp(tmp_path: Path) -> None:
    ws, pristine = make_workspace(tmp_path)
    tmp1 = tmp_path / "tmp1"
    tmp1.mkdir()
    d = start_daemon(tmp_path, f"--workspace={ws}", f"--temp-dir={tmp1}")
    try:
        # What an agent's rollout leaves behind:
        d.exec("echo hacked > app.py && echo new > new.py && echo x > debug.log", cwd=str(ws))
        d.exec("git add -A && git -c user.name=a -c user.email=a@a commit -qm agent", cwd=str(ws))
        d.exec("git checkout -q -b side", cwd=str(ws))
        d.exec(f"echo junk > {tmp1}/junk && mkdir {tmp1}/dir")
        bg = d.ok("POST", "/v1/processes", {"cmd": ["sleep", "300"]})
        d.exec("sleep 301 >/dev/null 2>&1 &")  # an orphan the daemon adopted
        session = d.ok("POST", "/v1/sessions", {})
        assert git(ws, "rev-parse", "HEAD").strip() != pristine

        report = d.ok("POST", "/v1/reset")

        assert report["clean"] is True, report
        assert report["drift"] == []
        assert git(ws, "rev-parse", "HEAD").strip() == pristine
        assert git(ws, "symbolic-ref", "--short", "HEAD").strip() == "main"
        assert (ws / "app.py").read_text() == "print('v1')\n"
        assert not (ws / "new.py").exists() and not (ws / "debug.log").exists()
        assert git(ws, "status", "--porcelain", "--ignored") == ""
        assert list(tmp1.iterdir()) == []
        assert d.request("GET", f"/v1/processes/{bg['id']}")[0] == 404
        assert d.request("GET", f"/v1/sessions/{session['id']}")[0] == 404
        time.sleep(0.2)
        kids = [e for e in os.listdir("/proc") if e.isdigit() and _ppid(e) == d.proc.pid]
        assert kids == [], kids
        # The sandbox is usable again right away.
        assert d.exec(["cat", "app.py"], cwd=str(ws))["stdout"] == "print('v1')\n"
    finally:
        stop_daemon(d)


def _ppid(pid: str) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def test_unfixable_drift_is_reported_not_clean(tmp_path: Path) -> None:
    ws, _ = make_workspace(tmp_path)
    manifest = tmp_path / "requirements.lock"
    manifest.write_text("numpy==2.0\n")
    tmp1 = tmp_path / "tmp1"
    tmp1.mkdir()
    d = start_daemon(tmp_path, f"--workspace={ws}", f"--temp-dir={tmp1}", f"--manifest={manifest}")
    try:
        assert d.ok("POST", "/v1/reset")["clean"] is True
        # An agent upgraded a dependency outside the workspace: reset cannot undo it.
        d.exec(f"echo numpy==2.1 > {manifest}")
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is False
        assert any("requirements.lock" in x for x in report["drift"]), report
    finally:
        stop_daemon(d)


def test_pristine_record_survives_daemon_restart(tmp_path: Path) -> None:
    ws, pristine = make_workspace(tmp_path)
    tmp1 = tmp_path / "tmp1"
    tmp1.mkdir()
    d = start_daemon(tmp_path, f"--workspace={ws}", f"--temp-dir={tmp1}")
    d.exec("git -c user.name=a -c user.email=a@a commit -q --allow-empty -m agent", cwd=str(ws))
    stop_daemon(d)
    # A restarted daemon compares with the first record, not with what it finds.
    d = start_daemon(tmp_path, f"--workspace={ws}", f"--temp-dir={tmp1}")
    try:
        assert d.ok("GET", "/v1/status")["pristine_commit"] == pristine
        assert d.ok("POST", "/v1/reset")["clean"] is True
        assert git(ws, "rev-parse", "HEAD").strip() == pristine
    finally:
        stop_daemon(d)


def test_status_reports_activity(daemon: Daemon) -> None:
    before = daemon.ok("GET", "/v1/status")
    time.sleep(0.05)
    daemon.exec(["true"])
    after = daemon.ok("GET", "/v1/status")
    assert after["last_activity_at"] > before["last_activity_at"]
    # The exec counts; reading the status (the reaper's poll) does not.
    assert after["api_calls"] == before["api_calls"] + 1
    assert after["uptime_s"] > 0 and after["resources"]["rootfs_free_bytes"] > 0
    assert any(p["pid"] == daemon.proc.pid for p in after["processes"])
    # Health checks and status reads are not activity (the idle reaper relies on that).
    daemon.request("GET", "/healthz")
    daemon.request("GET", "/metrics")
    again = daemon.ok("GET", "/v1/status")
    assert again["api_calls"] == after["api_calls"]
    assert again["last_activity_at"] == after["last_activity_at"]
