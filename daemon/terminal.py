"""Interactive programs on a pseudo-terminal, over a WebSocket (``GET /v1/pty``).

For ``kubectl sandman shell``: vim, a Python REPL, ``top``. The protocol
(daemon/API.md has it for clients):

1. the client opens a WebSocket on ``/v1/pty`` (token as on every endpoint);
2. its first message is text, the start request:
   ``{"cmd": [...] | "shell string" (default: the image's shell), "cwd",
   "env", "rows", "cols", "term"}``;
3. the daemon answers ``{"type": "started", "pid": N}`` (text), then sends the
   terminal's output as binary messages, as fast as the client takes them;
4. the client sends keystrokes as binary messages (Ctrl-C is the byte 0x03:
   the terminal's line discipline turns it into SIGINT for the program, as on
   a real terminal), and text ``{"type": "resize", "rows": R, "cols": C}``
   when its window changes (the program gets SIGWINCH);
5. when the program exits the daemon sends what it still wrote, then
   ``{"type": "exit", "exit_code": N}`` (-N: killed by signal N) and closes.

A client that closes or loses the connection hangs the terminal up: the
program's session gets SIGHUP, and SIGKILL after a grace period (as
sshd and a terminal emulator do).

Imported only when a terminal is opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from typing import Any

from sandman.daemon.children import kill_tree, set_window_size, spawn_pty
from sandman.daemon.commands import start_error
from sandman.daemon.errors import APIError, BadRequest, Conflict
from sandman.daemon.output import pump
from sandman.daemon.requests import PtyRequest, pty_request, resize_request
from sandman.daemon.websocket import (
    BINARY,
    INTERNAL,
    NORMAL,
    POLICY,
    TEXT,
    WebSocket,
    WebSocketClosed,
)

log = logging.getLogger("sandmand")

# After a hangup (the client left) the program has this long to exit on
# SIGHUP before the whole tree gets SIGKILL (an editor saves its swap file).
HANGUP_GRACE_S = 2.0
# The first message must come soon: a socket that never says what to run
# holds a connection for nothing.
START_TIMEOUT_S = 30.0
# Terminals open at once per sandbox: each is a process tree and a connection;
# a person needs a few, an agent that leaks them is stopped here.
MAX_TERMINALS = 16


def default_shell() -> tuple[str, ...]:
    for candidate in ("/bin/bash", "/bin/sh"):
        if os.access(candidate, os.X_OK):
            return (candidate,)
    raise BadRequest("this image has no /bin/sh: give cmd as an argv list", code="no_shell")


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _write_all(fd: int, data: bytes) -> None:
    """Write keystrokes to the terminal, waiting while its input queue is full
    (a program that does not read its input slows the client down)."""
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_writer(fd, _set_once, ready)
            try:
                await ready
            finally:
                loop.remove_writer(fd)


async def _start_message(ws: WebSocket) -> PtyRequest:
    try:
        kind, payload = await asyncio.wait_for(ws.receive(), START_TIMEOUT_S)
    except TimeoutError:
        raise BadRequest(f"no start message within {START_TIMEOUT_S:.0f}s") from None
    if kind != TEXT:
        raise BadRequest("the first message is the start request, as JSON text")
    try:
        body = json.loads(payload)
    except ValueError as e:
        raise BadRequest(f"invalid JSON: {e}", code="invalid_json") from None
    return pty_request(body)


async def _error(ws: WebSocket, e: APIError, close_code: int) -> None:
    await ws.send_text(json.dumps({"type": "error", **e.body()}))
    await ws.close(close_code, e.code)


async def run(ws: WebSocket, st: Any) -> None:
    """One terminal session on an accepted WebSocket; returns when it is over.

    ``st`` is the DaemonState (reaper, base environment, default directory).
    """
    try:
        req = await _start_message(ws)
        argv = req.argv or default_shell()
    except APIError as e:
        await _error(ws, e, POLICY)
        return
    env = {**st.base_env, "TERM": req.term, **req.env}
    cwd = req.cwd or st.sessions.default_cwd
    if not os.path.isdir(cwd):
        await _error(ws, BadRequest(f"cwd {cwd!r} is not a directory", code="bad_cwd"), POLICY)
        return
    try:
        child, master = spawn_pty(st.reaper, argv, cwd=cwd, env=env, rows=req.rows, cols=req.cols)
    except OSError as e:
        await _error(ws, start_error(argv, cwd, e), POLICY)
        return
    st.terminals += 1
    try:
        await _serve(ws, child, master)
    finally:
        st.terminals -= 1


async def _serve(ws: WebSocket, child: Any, master: int) -> None:
    loop = asyncio.get_running_loop()
    output = asyncio.ensure_future(
        # A dup: pump closes its fd at the end, the input side keeps writing.
        pump(os.dup(master), ws.send_bytes, child.exited)
    )
    inputs = asyncio.ensure_future(_forward_input(ws, master))
    try:
        await ws.send_text(json.dumps({"type": "started", "pid": child.pid}))
        # Over when the program's output is done (it exited and the terminal
        # drained), or when the client went away.
        done, _ = await asyncio.wait({output, inputs}, return_when=asyncio.FIRST_COMPLETED)
        if output in done:
            output.result()  # the client left mid-write: WebSocketClosed
            code = await child.exited
            # MUST stop reading before close() reads on to the client's close.
            inputs.cancel()
            with contextlib.suppress(asyncio.CancelledError, WebSocketClosed):
                await inputs
            await ws.send_text(json.dumps({"type": "exit", "exit_code": code}))
            await ws.close(NORMAL)
        else:
            inputs.result()  # raises what ended the input side
    except (WebSocketClosed, asyncio.CancelledError) as e:
        if isinstance(e, WebSocketClosed) and e.code not in (NORMAL, 1001):
            log.info("terminal of pid %d: %s", child.pid, e)
        raise
    except Exception:
        log.exception("terminal of pid %d failed", child.pid)
        await ws.close(INTERNAL, "internal error")
    finally:
        for t in (inputs, output):
            t.cancel()
        with contextlib.suppress(OSError):
            os.close(master)
        if not child.exited.done():
            _hang_up(loop, child)


def _hang_up(loop: asyncio.AbstractEventLoop, child: Any) -> None:
    kill_tree(child.pid, signal.SIGHUP)

    def finish() -> None:
        # The reaper resolves `exited` when the pid is reaped: until then the
        # pid is still this child's (never another process's).
        if not child.exited.done():
            kill_tree(child.pid)

    loop.call_later(HANGUP_GRACE_S, finish)


async def _forward_input(ws: WebSocket, master: int) -> None:
    """Client -> terminal until the client closes (raises WebSocketClosed)."""
    while True:
        kind, payload = await ws.receive()
        if kind == BINARY:
            try:
                await _write_all(master, payload)
            except OSError:  # the program is gone: its exit is on its way
                continue
            continue
        try:
            msg = json.loads(payload)
            if not isinstance(msg, dict):
                raise ValueError("not an object")
        except ValueError:
            await ws.send_text(
                json.dumps(
                    {
                        "type": "error",
                        **BadRequest("control messages are JSON objects").body(),
                    }
                )
            )
            continue
        kind_name = msg.get("type")
        try:
            if kind_name == "resize":
                rows, cols = resize_request(msg)
                with contextlib.suppress(OSError):
                    set_window_size(master, rows, cols)
            else:
                raise BadRequest(f"unknown message type {kind_name!r}; known: resize")
        except APIError as e:
            await ws.send_text(json.dumps({"type": "error", **e.body()}))


def check_capacity(st: Any) -> None:
    """Before the upgrade: a plain HTTP 409 when the sandbox has enough terminals."""
    if st.terminals >= MAX_TERMINALS:
        raise Conflict(f"at most {MAX_TERMINALS} terminals at once; close one", code="too_many")
