"""E2B commands as the daemon's background processes: start, stream, deadline, forget.

envd semantics kept (e2b-dev/infra envd ``process/start.go``): a command's
``timeout`` (the stream's ``connect-timeout-ms``) is its lifetime, after
which it is killed; a client that disconnects does not kill it; a command
is listed and can be re-attached (``Connect``) while it runs; once it has
ended and its output was delivered it is forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sandman.adapters.e2b import wire
from sandman.adapters.e2b.connect import ConnectError
from sandman.client import DaemonError, Process, SandmanError

log = logging.getLogger(__name__)

# How long one output long-poll waits for new bytes. It bounds how late a
# stream notices that its client went away and when a keepalive can go out;
# each poll is one request, so shorter costs more requests per idle command.
POLL_WAIT_S = 5.0
# A `wait` long-poll of the watcher (the daemon accepts at most 3600 s); each
# return just starts the next one.
WAIT_S = 60.0


@dataclass
class Tracked:
    """One command the gateway started, from start until it is forgotten.

    The bug it prevents: the daemon keeps at most 256 process records until
    they are deleted, so a gateway that never deletes finished commands
    stops being able to start any. A finished command's record is deleted
    as soon as no stream is still delivering its output (``streams`` counts
    them), never while one is, or that stream would lose its tail.
    Event-loop only.
    """

    process: Process
    config: dict[str, Any]  # ProcessConfig as sent: cmd, args, envs, cwd
    tag: str | None
    exit_code: int | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    streams: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set while streams == 0

    @property
    def pid(self) -> int:
        return self.process.pid

    def attach(self) -> None:
        self.streams += 1
        self.idle.clear()

    def detach(self) -> None:
        self.streams -= 1
        if self.streams == 0:
            self.idle.set()


class ProcessTable:
    """The commands running in one sandbox, by pid; each has a watcher task.

    Event-loop only. ``close`` cancels the watchers (the processes die with
    the sandbox, or live on if the gateway merely stops).
    """

    def __init__(self) -> None:
        self._procs: dict[int, Tracked] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def running(self) -> list[Tracked]:
        return [t for t in self._procs.values() if not t.ended.is_set()]

    def get(self, kind: str, key: int | str) -> Tracked:
        for t in self._procs.values():
            if (t.pid if kind == "pid" else t.tag) == key and not t.ended.is_set():
                return t
        raise ConnectError("not_found", f"process with {kind} {key} not found")

    def add(self, tracked: Tracked, timeout_s: float | None) -> None:
        """Track a started command; MUST be called before its first stream attaches,
        so a command that ends at once is not forgotten before anyone reads it."""
        self._procs[tracked.pid] = tracked
        tracked.attach()  # the starting stream; detached by the caller when it ends
        task = asyncio.create_task(self._watch(tracked, timeout_s))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, t: Tracked, timeout_s: float | None) -> None:
        try:
            try:
                async with asyncio.timeout(timeout_s):
                    while True:
                        info = await t.process.wait(timeout_s=WAIT_S)
                        if not info.get("running", False):
                            break
            except TimeoutError:
                # The command's timeout is its lifetime (envd kills it then too).
                await t.process.signal("KILL")
                info = await t.process.wait(timeout_s=WAIT_S)
            code = info.get("exit_code")
            t.exit_code = -9 if code is None else int(code)
        except SandmanError as e:
            log.warning("lost track of process %d: %s", t.pid, e)
            t.exit_code = -1
        t.ended.set()
        await t.idle.wait()
        self._procs.pop(t.pid, None)
        with contextlib.suppress(SandmanError):
            await t.process.kill()  # deletes the record; the command has exited already

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def stream_events(
    t: Tracked,
    *,
    keepalive_s: float | None,
    from_now: bool,
    clock: Callable[[], float],
    client_gone: Callable[[], bool],
) -> AsyncIterator[dict[str, Any]]:
    """ProcessEvents of a tracked command: data as it comes, keepalives, then the end.

    One long-poll on the combined output wakes the stream; stdout and stderr
    are then read from their own offsets without waiting, so a command costs
    one held daemon connection, not two. ``from_now`` (a re-attach) skips
    output produced before it.
    """
    offsets = {"combined": 0, "stdout": 0, "stderr": 0}
    if from_now:
        ends = (await t.process.info()).get("output_bytes") or {}
        offsets = {stream: int(ends.get(stream, 0)) for stream in offsets}
    last_sent = clock()
    while True:
        finished = t.ended.is_set()  # MUST be read before the reads: then they see every byte
        for stream in ("stdout", "stderr"):
            while True:
                data, offsets[stream] = await t.process.output(
                    offset=offsets[stream], stream=stream
                )
                if not data:
                    break
                last_sent = clock()
                yield wire.data_event(stream, data)
        if finished:
            break
        if client_gone():
            return  # nobody to deliver to; the command runs on (envd does the same)
        if keepalive_s is not None and clock() - last_sent >= keepalive_s:
            last_sent = clock()
            yield wire.keepalive_event()
        try:
            _, offsets["combined"] = await t.process.output(
                offset=offsets["combined"], stream="combined", wait_s=POLL_WAIT_S
            )
        except DaemonError as e:
            if e.status != 404:
                raise
            await t.ended.wait()  # the record went away: the watcher saw the end
    assert t.exit_code is not None
    yield wire.end_event(t.exit_code)


def process_config(msg: Mapping[str, Any]) -> dict[str, Any]:
    """The ProcessConfig of a StartRequest, normalised (the SDK may omit empties)."""
    cfg = msg.get("process") or {}
    if not cfg.get("cmd"):
        raise ConnectError("invalid_argument", "process.cmd is required")
    out: dict[str, Any] = {"cmd": str(cfg["cmd"]), "args": [str(a) for a in cfg.get("args") or []]}
    out["envs"] = {str(k): str(v) for k, v in (cfg.get("envs") or {}).items()}
    if cfg.get("cwd"):
        out["cwd"] = str(cfg["cwd"])
    return out
