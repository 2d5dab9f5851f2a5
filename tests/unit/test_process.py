from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sandman.harness.cluster.process import ComponentFailed, ManagedProcess, wait_until


def proc(tmp_path: Path, *argv: str, name: str = "p") -> ManagedProcess:
    return ManagedProcess(
        name=name,
        argv=argv,
        run_dir=tmp_path / "run",
        log_dir=tmp_path / "logs",
        stop_timeout_s=2,
    )


def test_start_is_idempotent_and_stop_kills(tmp_path: Path) -> None:
    p = proc(tmp_path, "sleep", "60")
    pid = p.start()
    assert p.start() == pid
    assert p.running_pid() == pid
    assert p.stop() is True
    assert p.running_pid() is None
    assert not p.pid_file.exists()
    assert p.stop() is False


def test_sigterm_ignoring_process_is_killed(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)"
    )
    p = proc(tmp_path, sys.executable, "-c", code)
    p.start()
    wait_until(p, lambda: "up" in p.log_tail(), timeout_s=10, what="started")
    assert p.stop() is True
    assert p.running_pid() is None


def test_reused_pid_is_not_ours(tmp_path: Path) -> None:
    # A pid file whose start time does not match the live process must not be
    # treated as ours, or `down` could kill an unrelated process.
    other = proc(tmp_path, "sleep", "60", name="other")
    pid = other.start()
    try:
        mine = proc(tmp_path, "sleep", "60", name="mine")
        mine.run_dir.mkdir(parents=True, exist_ok=True)
        mine.pid_file.write_text(json.dumps({"pid": pid, "start_time": 1, "argv": ["x"]}))
        assert mine.running_pid() is None
        assert mine.stop() is False
        assert other.running_pid() == pid
    finally:
        other.stop()


def test_wait_until_reports_death_with_log(tmp_path: Path) -> None:
    p = proc(tmp_path, "sh", "-c", "echo boom-marker; sleep 0.3; exit 3")
    p.start()
    with pytest.raises(ComponentFailed) as e:
        wait_until(p, lambda: False, timeout_s=10, what="healthy")
    assert "exited while waiting for healthy" in str(e.value)
    assert "boom-marker" in str(e.value)


def test_changed_arguments_restart_the_process(tmp_path: Path) -> None:
    first = proc(tmp_path, "sleep", "60")
    pid = first.start()
    again = proc(tmp_path, "sleep", "61")  # same component, new arguments
    try:
        new_pid = again.start()
        assert new_pid != pid
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
        assert again.running_pid() == new_pid
        assert again.start() == new_pid  # same arguments: left running
    finally:
        again.stop()
