"""Background processes: start, list, re-read output, write stdin, signal, wait.

Output goes to rings addressed by absolute offsets, so a client that lost its
connection reconnects and continues from the last offset it saw (and learns
how much, if anything, fell out of the ring meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandman.daemon.children import Child, ChildReaper, kill_tree, spawn
from sandman.daemon.commands import start_error
from sandman.daemon.errors import BadRequest, Conflict, NotFound
from sandman.daemon.output import Ring, encode, feed, pump
from sandman.daemon.requests import StartRequest

STREAMS = ("stdout", "stderr", "combined")


@dataclass
class Background:
    id: str
    name: str | None
    argv: tuple[str, ...]
    child: Child
    started: float
    rings: dict[str, Ring]
    exit_code: int | None = None
    ended: float | None = None
    # While running, the sandbox is not idle (the reaper leaves it alone).
    keeps_active: bool = True
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _stdin_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def running(self) -> bool:
        return self.exit_code is None

    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "cmd": list(self.argv),
            "pid": self.child.pid,
            "running": self.running,
            "exit_code": self.exit_code,
            "started_at": self.started,
            "ended_at": self.ended,
            "stdin_open": self.child.stdin is not None,
            "keeps_active": self.keeps_active,
            "output_bytes": {k: r.end for k, r in self.rings.items()},
        }

    def output(self, stream: str, offset: int, limit: int) -> dict[str, Any]:
        ring = self.rings[stream]
        data, start, dropped = ring.read(offset, limit)
        text, enc = encode(data)
        return {
            "data": text,
            "encoding": enc,
            "offset": start,
            "next_offset": start + len(data),
            "dropped": dropped,
            "end": ring.end,
            "running": self.running,
            "exit_code": self.exit_code,
        }

    async def write_stdin(self, data: bytes, eof: bool) -> None:
        if self.child.stdin is None:
            raise Conflict(f"stdin of process {self.id} is closed", code="stdin_closed")
        async with self._stdin_lock:
            fd = self.child.stdin
            if data:
                dup = os.dup(fd)
                os.set_blocking(dup, False)
                await feed(dup, data)
            if eof:
                self.child.stdin = None
                with contextlib.suppress(OSError):
                    os.close(fd)

    def signal(self, sig: int) -> None:
        if not self.running:
            raise Conflict(f"process {self.id} has exited", code="not_running")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, sig)

    async def wait(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.child.exited), timeout)
        return not self.running


class BackgroundProcesses:
    """All background processes. Event-loop only (not thread-safe)."""

    def __init__(
        self,
        reaper: ChildReaper,
        base_env: dict[str, str],
        ring_bytes: int,
        max_count: int,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        self._on_exit = on_exit
        self._reaper = reaper
        self._env = base_env
        self._ring_bytes = ring_bytes
        self._max = max_count
        self._procs: dict[str, Background] = {}

    def start(self, req: StartRequest) -> Background:
        if len(self._procs) >= self._max and not self._forget_oldest_finished():
            raise Conflict(
                f"at most {self._max} background processes, all running; delete or stop one",
                code="too_many",
            )
        if req.cwd and not os.path.isdir(req.cwd):
            raise BadRequest(f"cwd {req.cwd!r} is not a directory", code="bad_cwd")
        try:
            child = spawn(
                self._reaper, req.argv, cwd=req.cwd, env={**self._env, **req.env}, stdin=req.stdin
            )
        except OSError as e:
            raise start_error(req.argv, req.cwd, e) from None
        rings = {s: Ring(self._ring_bytes) for s in STREAMS}
        proc = Background(
            secrets.token_hex(6),
            req.name,
            req.argv,
            child,
            time.time(),
            rings,
            keeps_active=req.keeps_active,
        )

        def sink(stream: str):  # type: ignore[no-untyped-def]
            own, combined = rings[stream], rings["combined"]

            def on_data(data: bytes) -> None:
                own(data)
                combined(data)

            return on_data

        assert child.stdout is not None and child.stderr is not None
        proc._tasks = [
            asyncio.ensure_future(pump(child.stdout, sink("stdout"))),
            asyncio.ensure_future(pump(child.stderr, sink("stderr"))),
        ]

        def on_exit(f: asyncio.Future[int]) -> None:
            proc.exit_code = f.result() if not f.cancelled() else -9
            proc.ended = time.time()
            for ring in rings.values():
                ring.wake()  # followers learn that it ended
            if self._on_exit is not None and proc.keeps_active:
                self._on_exit()  # the idle time starts now, not at its start

        child.exited.add_done_callback(on_exit)
        self._procs[proc.id] = proc
        return proc

    def _forget_oldest_finished(self) -> bool:
        """Make room at the cap: drop the record of the process that finished
        first (its output with it). False when every process still runs."""
        finished = [p for p in self._procs.values() if not p.running]
        if not finished:
            return False
        oldest = min(finished, key=lambda p: p.ended or 0.0)
        del self._procs[oldest.id]
        for t in oldest._tasks:
            t.cancel()
        if oldest.child.stdin is not None:
            with contextlib.suppress(OSError):
                os.close(oldest.child.stdin)
            oldest.child.stdin = None
        return True

    def get(self, pid: str) -> Background:
        try:
            return self._procs[pid]
        except KeyError:
            raise NotFound(f"no process {pid!r}") from None

    def list(self) -> list[Background]:
        return list(self._procs.values())

    @property
    def keeping_active(self) -> bool:
        """A running process that counts as use (the idle figure stays 0)."""
        return any(p.running and p.keeps_active for p in self._procs.values())

    async def delete(self, pid: str) -> None:
        proc = self.get(pid)
        del self._procs[pid]
        if proc.running:
            kill_tree(proc.child.pid)
            await proc.child.exited
        for t in proc._tasks:
            t.cancel()
        if proc.child.stdin is not None:
            with contextlib.suppress(OSError):
                os.close(proc.child.stdin)
            proc.child.stdin = None

    async def close_all(self) -> None:
        for pid in list(self._procs):
            await self.delete(pid)
