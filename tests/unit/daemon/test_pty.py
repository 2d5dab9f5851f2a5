"""GET /v1/pty: programs on a pseudo-terminal over a WebSocket, against a real daemon."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sandman.harness.testing import async_wait_for, wait_for
from tests.unit.daemon.helpers import Daemon

pytestmark = pytest.mark.daemon_process

# Generous bound on one expected piece of output (a loaded 2-core machine);
# every wait ends as soon as the output is there.
READ_TIMEOUT_S = 60.0


class Term:
    """A terminal session on the daemon, read into one growing buffer."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.out = b""
        self.control: list[dict[str, Any]] = []

    async def _one(self) -> None:
        msg = await self.ws.receive(timeout=READ_TIMEOUT_S)
        if msg.type == aiohttp.WSMsgType.BINARY:
            self.out += msg.data
        elif msg.type == aiohttp.WSMsgType.TEXT:
            self.control.append(json.loads(msg.data))
        else:
            raise EOFError(f"socket ended: {msg.type} {msg.data!r} {msg.extra!r}")

    async def expect(self, text: bytes) -> bytes:
        """Read until ``text`` appears after what earlier expects consumed."""
        while text not in self.out:
            await self._one()
        i = self.out.index(text) + len(text)
        seen, self.out = self.out[:i], self.out[i:]
        return seen

    async def type(self, text: str) -> None:
        await self.ws.send_bytes(text.encode())

    async def resize(self, rows: int, cols: int) -> None:
        await self.ws.send_str(json.dumps({"type": "resize", "rows": rows, "cols": cols}))

    async def exit_code(self) -> int:
        while not any(m.get("type") == "exit" for m in self.control):
            await self._one()
        return next(m for m in self.control if m.get("type") == "exit")["exit_code"]


def foreground_sleep(shell_pid: int) -> bool:
    """`sleep 1017`, child of the shell, is its terminal's foreground group."""
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{e}/cmdline").read_bytes()
            fields = Path(f"/proc/{e}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # stat fields after the name: state ppid pgrp session tty_nr tpgid
        if cmd == b"sleep\x001017\x00" and int(fields[1]) == shell_pid:
            return int(fields[2]) == int(fields[5])
    return False


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def open_term(daemon: Daemon, http: aiohttp.ClientSession, **start: Any) -> Term:
    ws = await http.ws_connect(
        f"http://127.0.0.1:{daemon.port}/v1/pty",
        headers={"Authorization": f"Bearer {daemon.token}"},
    )
    await ws.send_str(json.dumps(start))
    term = Term(ws)
    while not term.control:
        await term._one()
    assert term.control[0]["type"] == "started", term.control
    return term


async def test_shell_on_a_terminal_size_resize_ctrl_c_exit_code(
    daemon: Daemon, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    term = await open_term(
        daemon, http, cmd=["/bin/sh"], rows=30, cols=100, cwd=str(tmp_path), env={"PS1": "$ "}
    )
    await term.type("tty; stty size; echo $TERM; pwd\n")
    seen = await term.expect(str(tmp_path).encode())
    assert b"/dev/pts/" in seen and b"30 100" in seen and b"xterm-256color" in seen, seen
    # The window changes: the terminal's size follows.
    await term.resize(40, 132)
    await term.type("stty size\n")
    assert b"40 132" in await term.expect(b"40 132")
    # Ctrl-C is a byte; the line discipline makes it SIGINT for the foreground
    # program, and the shell comes back.
    await term.type("sleep 1017\n")
    await async_wait_for(
        lambda: foreground_sleep(term.control[0]["pid"]), timeout=20, what="sleep in the foreground"
    )
    await term.type("\x03")
    await term.type("echo after-$?\n")
    assert b"after-130" in await term.expect(b"after-130\r\n")
    await term.type("exit 3\n")
    assert await term.exit_code() == 3
    await term.ws.close()


async def test_python_repl_prompt_sigwinch_and_keyboard_interrupt(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    term = await open_term(daemon, http, cmd=[sys.executable, "-q"], rows=24, cols=80)
    await term.expect(b">>> ")
    await term.type("print(6 * 7)\r")
    assert b"42" in await term.expect(b">>> ")
    # A program that handles SIGWINCH sees the resize.
    await term.type(
        "import signal, os; signal.signal(signal.SIGWINCH, "
        "lambda *a: print('winch', os.get_terminal_size(), flush=True))\r"
    )
    await term.expect(b">>> ")
    await term.resize(50, 160)
    assert b"columns=160, lines=50" in await term.expect(b"lines=50)")
    # Ctrl-C only once the statement runs: typed earlier, it could interrupt
    # the line editor instead and leave the sleep to run. The marker is built at
    # run time so the echo of the typed line cannot match it.
    await term.type("import time; print('nap' + 'ping', flush=True); time.sleep(1000)\r")
    await term.expect(b"napping")
    await term.type("\x03")
    assert b"KeyboardInterrupt" in await term.expect(b">>> ")
    await term.type("raise SystemExit(5)\r")
    assert await term.exit_code() == 5


async def test_a_client_that_leaves_hangs_the_terminal_up(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    marker = f"hangup-{os.getpid()}"
    term = await open_term(daemon, http, cmd=["/bin/sh", "-c", f"sleep 1000 # {marker}"])
    pid = term.control[0]["pid"]
    assert Path(f"/proc/{pid}").exists()
    await term.ws.close()  # the client goes away while the program runs

    def gone() -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        return stat.rsplit(")", 1)[1].split()[0] == "Z"

    await async_wait_for(gone, timeout=20, what="the program to get SIGHUP")
    assert daemon.exec(["true"])["exit_code"] == 0


async def test_bad_starts_are_clear_errors(daemon: Daemon, http: aiohttp.ClientSession) -> None:
    url = f"http://127.0.0.1:{daemon.port}/v1/pty"
    auth = {"Authorization": f"Bearer {daemon.token}"}
    # Not a WebSocket: a plain 426 JSON error.
    async with http.get(url, headers=auth) as resp:
        assert resp.status == 426
        assert (await resp.json())["error"]["code"] == "upgrade_required"
    # No token: refused before any upgrade.
    with pytest.raises(aiohttp.WSServerHandshakeError) as e:
        await http.ws_connect(url)
    assert e.value.status == 401
    for start, code in (
        ({"cmd": ["no-such-program-xyz"]}, "cannot_start"),
        ({"cmd": ["true"], "rows": 0}, "bad_request"),
        ({"cmd": ["true"], "colour": 1}, "bad_request"),
        ({"cmd": ["true"], "cwd": "/no/such/dir"}, "bad_cwd"),
    ):
        ws = await http.ws_connect(url, headers=auth)
        await ws.send_str(json.dumps(start))
        msg = await ws.receive(timeout=READ_TIMEOUT_S)
        assert json.loads(msg.data)["error"]["code"] == code, (start, msg.data)
        closing = await ws.receive(timeout=READ_TIMEOUT_S)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        await ws.close()
    assert ws.close_code == 1008


def _frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bool = True) -> bytes:
    import struct

    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    m = 0x80 if mask else 0
    if n < 126:
        head += bytes([m | n])
    elif n < 1 << 16:
        head += bytes([m | 126]) + struct.pack("!H", n)
    else:
        head += bytes([m | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def _raw_ws(daemon: Daemon) -> Any:
    import base64
    import socket

    s = socket.create_connection(("127.0.0.1", daemon.port), timeout=READ_TIMEOUT_S)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        (
            "GET /v1/pty HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer {daemon.token}\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 101 "), head
    from sandman.daemon.websocket import accept_key

    assert f"Sec-WebSocket-Accept: {accept_key(key)}".encode() in head
    return s


def _read_frame(s: Any) -> tuple[int, bytes]:
    import struct

    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            assert chunk, "connection closed"
            buf += chunk
        return buf

    b0, b1 = exactly(2)
    n = b1 & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", exactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", exactly(8))
    return b0 & 0x0F, exactly(n)


def test_websocket_framing_fragments_ping_and_protocol_errors(daemon: Daemon) -> None:
    s = _raw_ws(daemon)
    # The start message in two fragments, a ping between them (allowed).
    start = json.dumps({"cmd": ["/bin/cat"]}).encode()
    s.sendall(_frame(0x1, start[:5], fin=False) + _frame(0x9, b"hi") + _frame(0x0, start[5:]))
    frames = [_read_frame(s), _read_frame(s)]
    assert (0xA, b"hi") in frames  # pong with the ping's payload
    assert any(op == 0x1 and b'"started"' in p for op, p in frames), frames
    # A frame the client did not mask: the daemon closes with 1002.
    s.sendall(_frame(0x2, b"x", mask=False))
    op, payload = _read_frame(s)
    while op != 0x8:
        op, payload = _read_frame(s)
    assert int.from_bytes(payload[:2], "big") == 1002
    s.close()
    assert daemon.exec(["true"])["exit_code"] == 0


def test_websocket_message_size_is_capped(daemon: Daemon) -> None:
    from sandman.daemon.websocket import MAX_MESSAGE_BYTES

    s = _raw_ws(daemon)
    s.sendall(_frame(0x1, json.dumps({"cmd": ["/bin/cat"]}).encode()))
    assert b'"started"' in _read_frame(s)[1]
    s.sendall(_frame(0x2, b"x" * (MAX_MESSAGE_BYTES + 1)))
    op, payload = _read_frame(s)
    while op != 0x8:
        op, payload = _read_frame(s)
    assert int.from_bytes(payload[:2], "big") == 1009
    s.close()


# The CLI's terminal glue (sandman/cli/terminal.py) in a process whose
# controlling terminal is a pseudo-terminal this test types into, against the
# daemon directly (the real node's e2e test goes through kubectl sandman).
CLI = """
import asyncio, ssl, sys
from sandman.cli import terminal
from sandman.client import Sandbox, SandmanClient
from sandman.client.transport import HttpTransport
from sandman.kube_async import Credentials, KubeClient

async def main(port, token, cmd):
    kube = KubeClient(Credentials("https://127.0.0.1:1", ssl.create_default_context()))
    transport = HttpTransport(kube, "direct", port=port)
    async with SandmanClient(kube=kube, namespace="ns", transport=transport) as c:
        meta = {"name": "sb", "namespace": "ns", "labels": {"sandman.dev/id": "i"}}
        sb = Sandbox(c, {"metadata": meta, "status": {"podIP": "127.0.0.1"}})
        sb._token = token
        return await terminal.interactive(sb, cmd or None)

sys.exit(asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3:])))
"""


def _cli(daemon: Daemon, *cmd: str) -> Any:
    from tests.pty_driver import PtyDriver

    return PtyDriver([sys.executable, "-c", CLI, str(daemon.port), daemon.token, *cmd])


def test_cli_terminal_raw_mode_resize_ctrl_c_exit_code_and_restore(daemon: Daemon) -> None:
    drv = _cli(daemon, "/bin/sh")
    try:
        drv.expect("# ")
        drv.type("stty size\r")
        assert b"24 80" in drv.expect("24 80")
        drv.resize(33, 111)  # the window changes: SIGWINCH to the CLI, a resize to the daemon
        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:  # the resize races the next command: ask until it shows
            drv.type("stty size\r")
            seen = drv.expect("# ")
            if b"33 111" in seen or time.monotonic() > deadline:
                break
        assert b"33 111" in seen, drv.log
        drv.type("sleep 1017\r")
        shell = next(int(p) for p in _children_named(daemon.proc.pid, b"/bin/sh"))
        wait_for(lambda: foreground_sleep(shell), timeout=20, what="sleep in the foreground")
        drv.type("\x03")  # raw mode: a byte for the remote terminal, not SIGINT here
        drv.type("echo after-$?\r")
        drv.expect("after-130\r\n")
        drv.type("exit 7\r")
        assert drv.wait() == 7
        assert drv.modes_restored()
    finally:
        drv.close()


def test_cli_terminal_restores_the_terminal_when_told_to_stop(daemon: Daemon) -> None:
    drv = _cli(daemon, "/bin/sh", "-c", "echo ready; sleep 1018")
    try:
        drv.expect("ready")
        drv.proc.send_signal(signal.SIGTERM)
        assert drv.wait() == 128 + signal.SIGTERM
        assert drv.modes_restored()
        # The program was hung up when the CLI left.
        wait_for(lambda: not _children_named(daemon.proc.pid, b"sleep"), timeout=20, what="hangup")
    finally:
        drv.close()


def _children_named(parent: int, argv0: bytes) -> list[str]:
    """Live descendants of ``parent`` whose argv[0] is ``argv0``."""
    from sandman.daemon.children import descendants

    out = []
    for pid in descendants(parent):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if argv[0] == argv0 and state != "Z":
            out.append(str(pid))
    return out
