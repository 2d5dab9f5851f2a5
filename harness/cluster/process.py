"""Long-lived host processes that outlive the CLI call that started them.

A component is identified by a pid file holding the pid *and* the process's
start time (field 22 of /proc/PID/stat). Checking both is what makes ``down``
stop exactly the processes ``up`` started: a bare pid can be reused by an
unrelated process after a reboot or a crash, and killing that would be a bug
far worse than leaving a component running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def _proc_start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = stat.rsplit(")", 1)[1].split()
    state = rest[0]
    if state in ("Z", "X"):
        return None
    return int(rest[19])


def _reap_if_child(pid: int) -> None:
    # When the process that started a component also stops it (the test
    # harness), the dead component is its child and stays a zombie until waited.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    start_time: int
    argv: tuple[str, ...]


@dataclass(frozen=True)
class ManagedProcess:
    """One component: how to run it and where its pid file and log live."""

    name: str
    argv: tuple[str, ...]
    run_dir: Path
    log_dir: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    stop_timeout_s: float = 10.0

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def record(self) -> ProcessRecord | None:
        try:
            d = json.loads(self.pid_file.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return ProcessRecord(int(d["pid"]), int(d["start_time"]), tuple(d["argv"]))

    def running_pid(self) -> int | None:
        rec = self.record()
        if rec is None:
            return None
        if _proc_start_time(rec.pid) != rec.start_time:
            _reap_if_child(rec.pid)
            return None
        return rec.pid

    def start(self) -> int:
        """Start the process detached (own session) unless it already runs.

        A running process started with other arguments (a new daemon image,
        another config) is restarted, so that `up` converges on the config.
        """
        pid = self.running_pid()
        if pid is not None:
            rec = self.record()
            if rec is not None and rec.argv == self.argv:
                return pid
            self.stop()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ if self.env is None else self.env)
        with _signals_deferred(), open(self.log_file, "ab") as log:
            log.write(f"\n=== {time.strftime('%FT%T')} start: {' '.join(self.argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                env=env,
                cwd=self.cwd,
            )
            start_time = None
            for _ in range(100):
                start_time = _proc_start_time(proc.pid)
                if start_time is not None:
                    break
                if proc.poll() is not None:
                    break
                time.sleep(0.01)
            if start_time is None:
                raise ComponentFailed(self, f"exited immediately with code {proc.poll()}")
            tmp = self.pid_file.with_suffix(".tmp")
            tmp.write_text(
                json.dumps({"pid": proc.pid, "start_time": start_time, "argv": list(self.argv)})
            )
            tmp.replace(self.pid_file)
        return proc.pid

    def stop(self) -> bool:
        """SIGTERM, then SIGKILL after the grace period. True if it was running."""
        rec = self.record()
        pid = self.running_pid()
        if pid is None or rec is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        while time.monotonic() < deadline:
            if _proc_start_time(pid) != rec.start_time:
                break
            _reap_if_child(pid)
            time.sleep(0.05)
        else:
            _signal_group(pid, signal.SIGKILL)
            while _proc_start_time(pid) == rec.start_time:
                _reap_if_child(pid)
                time.sleep(0.05)
        _reap_if_child(pid)
        self.pid_file.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = 40) -> str:
        try:
            data = self.log_file.read_bytes()[-64 * 1024 :]
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGTERM/SIGINT until the block ends, then deliver them.

    A caller that turns a signal into an exception (`sandman bench`) would
    otherwise raise it between the fork and the pid file: the component runs
    on, detached, and no pid file names it for ``stop``. Only the main thread
    runs signal handlers, so elsewhere there is nothing to hold.
    """
    sigs = (signal.SIGTERM, signal.SIGINT)
    # getsignal is None for a handler not set from Python: it could not be put back.
    foreign = any(signal.getsignal(s) is None for s in sigs)
    if threading.current_thread() is not threading.main_thread() or foreign:
        yield
        return
    held: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: held.append(signum)) for s in sigs}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for s in held:
            signal.raise_signal(s)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    # Components run as session leaders (start_new_session), so their process
    # group id is their pid; signalling the group catches helpers they fork.
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class ComponentFailed(RuntimeError):
    """A component did not start or become healthy; carries its log tail."""

    def __init__(self, proc: ManagedProcess, why: str) -> None:
        self.component = proc.name
        self.log_file = proc.log_file
        super().__init__(
            f"{proc.name} failed: {why}\n--- last lines of {proc.log_file} ---\n{proc.log_tail()}"
        )


def wait_until(
    proc: ManagedProcess,
    check: Callable[[], bool],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.1,
) -> None:
    """Poll ``check`` until true; fail fast (with the log) if the process dies."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.running_pid() is None:
            raise ComponentFailed(proc, f"exited while waiting for {what}")
        try:
            if check():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise ComponentFailed(proc, f"not {what} after {timeout_s:.0f}s")
        time.sleep(interval_s)


def stop_all(procs: Sequence[ManagedProcess]) -> list[str]:
    return [p.name for p in procs if p.stop()]


def wait_healthy(
    proc: ManagedProcess,
    check: Callable[[], bool],
    *,
    timeout_s: float,
    progress: Callable[[str], None],
) -> None:
    """Wait for a started component's health check and report how long it took."""
    t = time.monotonic()
    wait_until(proc, check, timeout_s=timeout_s, what="healthy")
    progress(f"  {proc.name:<24} healthy ({time.monotonic() - t:.1f}s) log: {proc.log_file}")
