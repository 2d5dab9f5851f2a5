"""Persistent shell sessions: `cd` and `export` persist between runs.

Each run sources a script file in a long-lived shell (so a command cannot eat
the next one from the shell's stdin), then the shell prints a per-run random
marker with the exit code and working directory on stdout and stderr; output
up to the marker is the run's. Runs in one session are serialised.

The script is sourced through a descriptor (``. /dev/fd/3 3< SCRIPT``), so
the shell's own messages name ``/dev/fd/3`` with line numbers counted from
the run's first line (``/dev/fd/3: line 2: foo: command not found``): never
the daemon's internal directory, nor the session's random id, and the same
for the same command in every session (seeded replays compare equal).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shlex
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandman.daemon.children import Child, ChildReaper, descendants, kill_tree, spawn
from sandman.daemon.commands import ExecResult
from sandman.daemon.errors import BadRequest, Conflict, NotFound, Unavailable
from sandman.daemon.output import Capture, feed, pump
from sandman.daemon.requests import RunRequest, SessionRequest

# After a timeout kills the run's child processes, the shell has this long to
# print its marker; a shell busy in a builtin loop (`while :; do :; done`)
# never will, and is then killed with its session.
MARKER_GRACE_S = 1.0
# The descriptor each run's script is sourced through (one digit: dash and
# busybox ash take no more in a redirection). Commands inherit it for the
# run's duration: a read-only descriptor of their own script.
SCRIPT_FD = 3


def script_source_path(fd: int = SCRIPT_FD) -> str | None:
    """A path that reopens descriptor ``fd`` of the shell itself, or None.

    Container runtimes create ``/dev/fd`` (-> /proc/self/fd); a bare chroot
    may only have /proc, or neither (then runs source the script's own path).
    """
    for base in ("/dev/fd", "/proc/self/fd"):
        if os.path.isdir(base):
            return f"{base}/{fd}"
    return None


class _MarkerStream:
    """Feeds a capture until the run's marker line shows up in the stream."""

    def __init__(self, marker: bytes, cap: int) -> None:
        self.tag = b"\n" + marker
        self.capture = Capture(cap)
        self._pending = b""
        self.trailer: bytes | None = None  # what followed the marker, once seen
        self.seen = asyncio.Event()

    def __call__(self, data: bytes) -> None:
        if self.trailer is not None:
            self.trailer += data
            return
        buf = self._pending + data
        i = buf.find(self.tag)
        if i >= 0:
            self.capture(buf[:i])
            self.trailer = buf[i + len(self.tag) :]
            self._pending = b""
            self.seen.set()
            return
        keep = len(self.tag) - 1  # a marker may straddle two chunks
        self.capture(buf[:-keep] if len(buf) > keep else b"")
        self._pending = buf[-keep:] if len(buf) > keep else buf

    def flush(self) -> None:
        """The stream ended without a marker: what was held back is output."""
        if self.trailer is None:
            self.capture(self._pending)
            self._pending = b""


@dataclass
class Session:
    id: str
    shell: str
    child: Child
    workdir: Path  # the session's private scratch dir (scripts, stdin files)
    created: float
    cwd: str
    runs: int = 0
    # What the shell sources each run's script as (script_source_path()).
    source: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _out: _MarkerStream | None = None
    _err: _MarkerStream | None = None
    _pumps: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def source_path(self) -> str:
        if self.source is not None:
            return self.source
        # No /dev/fd nor /proc: the script's own path (messages then name it).
        return shlex.quote(str(self.workdir / f"run-{self.runs}.sh"))

    @property
    def alive(self) -> bool:
        return not self.child.exited.done()

    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "shell": self.shell,
            "pid": self.child.pid,
            "alive": self.alive,
            "cwd": self.cwd,
            "runs": self.runs,
        }

    def _route(self, stream: str):  # type: ignore[no-untyped-def]
        def on_data(data: bytes) -> None:
            target = self._out if stream == "stdout" else self._err
            if target is not None:
                target(data)

        return on_data

    async def run(self, reaper: ChildReaper, req: RunRequest) -> tuple[ExecResult, bool]:
        """Run one command; returns (result, session still alive)."""
        if self.lock.locked():
            raise Conflict(f"session {self.id} is busy with another command", code="busy")
        async with self.lock:
            if not self.alive:
                raise Unavailable(f"session {self.id} has ended", code="session_ended")
            return await self._run_locked(req)

    async def _run_locked(self, req: RunRequest) -> tuple[ExecResult, bool]:
        if self._out is not None and self._err is not None:
            # A run whose client went away: its marker must pass before the
            # next run starts, or its late output would become the next run's.
            try:
                await asyncio.wait_for(
                    asyncio.gather(self._out.seen.wait(), self._err.seen.wait()), MARKER_GRACE_S
                )
            except TimeoutError:
                await self.close()
                raise Unavailable(f"session {self.id} has ended", code="session_ended") from None
        self.runs += 1
        marker = f"__SANDMAN_{secrets.token_hex(8)}__".encode()
        script = self.workdir / f"run-{self.runs}.sh"
        script.write_text(req.cmd + "\n")
        stdin_path = "/dev/null"
        if req.stdin is not None:
            stdin_file = self.workdir / f"stdin-{self.runs}"
            stdin_file.write_bytes(req.stdin)
            stdin_path = str(stdin_file)
        m = marker.decode()
        line = (
            f"{{ . {self.source_path}; }} {SCRIPT_FD}< {shlex.quote(str(script))}"
            f" < {shlex.quote(stdin_path)}; "
            f'__sandman_rc=$?; printf \'\\n{m} %d %s\\n\' "$__sandman_rc" "$PWD"; '
            f"printf '\\n{m}\\n' >&2\n"
        )
        self._out = _MarkerStream(marker, req.max_output_bytes)
        self._err = _MarkerStream(marker, req.max_output_bytes)
        t0 = time.monotonic()
        assert self.child.stdin is not None
        await _write_all(self.child.stdin, line.encode())
        timed_out = False
        markers = asyncio.ensure_future(
            asyncio.gather(self._out.seen.wait(), self._err.seen.wait())
        )
        ended = {markers, self.child.exited}
        try:
            done, _ = await asyncio.wait(
                ended, timeout=req.timeout_s, return_when="FIRST_COMPLETED"
            )
            if not done:
                timed_out = True
                # Kill what the run started, keep the shell (and its cd/export).
                for pid in descendants(self.child.pid):
                    kill_tree(pid)
                done, _ = await asyncio.wait(
                    ended, timeout=MARKER_GRACE_S, return_when="FIRST_COMPLETED"
                )
                if not done:
                    await self.close()
        except asyncio.CancelledError:
            # The client went away mid-run: stop the run, keep the session.
            for pid in descendants(self.child.pid):
                kill_tree(pid)
            raise
        finally:
            if not markers.done():
                markers.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await markers
        if not self.alive:
            # Output written just before the shell ended is still in flight.
            await asyncio.wait(self._pumps, timeout=0.2)
            self._out.flush()
            self._err.flush()
        out, err = self._out, self._err
        self._out = self._err = None
        code = -int(signal.SIGKILL) if timed_out else 0
        if out.trailer is not None:
            head = out.trailer.split(b"\n", 1)[0].decode(errors="replace").strip().split(" ", 1)
            with contextlib.suppress(ValueError):
                code = int(head[0])
            if len(head) > 1:
                self.cwd = head[1]
        elif not self.alive:
            # The command ended the shell itself (`exit 3`): its status is the run's.
            code = self.child.exited.result()
        for p in (script, self.workdir / f"stdin-{self.runs}"):
            p.unlink(missing_ok=True)
        result = ExecResult(
            exit_code=code,
            stdout=out.capture.value(),
            stderr=err.capture.value(),
            timed_out=timed_out,
            truncated=out.capture.truncated or err.capture.truncated,
            duration_ms=(time.monotonic() - t0) * 1000,
        )
        return result, self.alive

    async def close(self) -> None:
        if self.alive:
            kill_tree(self.child.pid)
            with contextlib.suppress(asyncio.CancelledError):
                await self.child.exited
        for p in self._pumps:
            p.cancel()
        if self.child.stdin is not None:
            with contextlib.suppress(OSError):
                os.close(self.child.stdin)
            self.child.stdin = None
        for f in self.workdir.glob("*"):
            f.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.workdir.rmdir()


async def _write_all(fd: int, data: bytes) -> None:
    # feed() closes the fd when done; the shell's stdin must stay open.
    dup = os.dup(fd)
    os.set_blocking(dup, False)
    await feed(dup, data)


class Sessions:
    """All sessions of the daemon. Event-loop only (not thread-safe)."""

    def __init__(
        self,
        reaper: ChildReaper,
        base_env: dict[str, str],
        scratch: Path,
        max_sessions: int,
        default_cwd: str,
    ) -> None:
        self._reaper = reaper
        self._env = base_env
        self._scratch = scratch
        self._max = max_sessions
        self._default_cwd = default_cwd
        self._sessions: dict[str, Session] = {}

    @property
    def default_cwd(self) -> str:
        """Where sessions (and terminals) start: the workspace, else /."""
        return self._default_cwd

    def _shell(self, wanted: str | None) -> str:
        if wanted:
            if not os.access(wanted, os.X_OK):
                raise BadRequest(f"shell {wanted!r} is not an executable file")
            return wanted
        for candidate in ("/bin/bash", "/bin/sh"):
            if os.access(candidate, os.X_OK):
                return candidate
        raise BadRequest("this image has no /bin/sh: sessions need a shell", code="no_shell")

    async def create(self, req: SessionRequest) -> Session:
        if len(self._sessions) >= self._max:
            raise Conflict(f"at most {self._max} sessions; delete one first", code="too_many")
        shell = self._shell(req.shell)
        cwd = req.cwd or self._default_cwd
        if not os.path.isdir(cwd):
            raise BadRequest(f"cwd {cwd!r} is not a directory", code="bad_cwd")
        sid = secrets.token_hex(6)
        workdir = self._scratch / f"session-{sid}"
        workdir.mkdir(parents=True, exist_ok=True)
        env = {**self._env, **req.env}
        try:
            child = spawn(self._reaper, [shell], cwd=cwd, env=env, stdin=True)
        except OSError as e:
            raise BadRequest(f"cannot start {shell}: {e.strerror}") from None
        session = Session(sid, shell, child, workdir, time.time(), cwd, source=script_source_path())
        assert child.stdout is not None and child.stderr is not None
        session._pumps = [
            asyncio.ensure_future(pump(child.stdout, session._route("stdout"))),
            asyncio.ensure_future(pump(child.stderr, session._route("stderr"))),
        ]
        self._sessions[sid] = session
        return session

    def get(self, sid: str) -> Session:
        try:
            return self._sessions[sid]
        except KeyError:
            raise NotFound(f"no session {sid!r}") from None

    def list(self) -> list[Session]:
        return list(self._sessions.values())

    async def delete(self, sid: str) -> None:
        session = self.get(sid)
        del self._sessions[sid]
        await session.close()

    async def close_all(self) -> None:
        for sid in list(self._sessions):
            await self.delete(sid)


def result_json(result: ExecResult, session: Session, alive: bool) -> dict[str, Any]:
    doc = result.to_json()
    doc["cwd"] = session.cwd
    doc["session_alive"] = alive
    return doc
