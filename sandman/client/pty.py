"""An interactive program on a pseudo-terminal in a sandbox (the daemon's ``/v1/pty``).

    async with await sandbox.pty(["python3"], rows=24, cols=80) as term:
        await term.write(b"print(6 * 7)\\r")
        async for chunk in term:          # the terminal's output, as it comes
            ...
        print(term.exit_code)

It is what ``kubectl sandman shell`` runs (sandman/cli/terminal.py puts the
local terminal in raw mode around it). Works over both transports: directly to
the pod, and through the apiserver's pods/proxy, which passes the WebSocket
upgrade through.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from sandman.client.errors import DaemonError, ProtocolError, TransportError
from sandman.client.transport import DaemonSocket

# A start answer should come at once; a busy node and a slow apiserver take
# seconds, not this.
START_TIMEOUT_S = 30.0


def start_message(
    cmd: str | Sequence[str] | None,
    *,
    rows: int,
    cols: int,
    cwd: str | None,
    env: Mapping[str, str] | None,
    term: str,
) -> dict[str, Any]:
    msg: dict[str, Any] = {"rows": rows, "cols": cols, "term": term}
    if cmd is not None:
        msg["cmd"] = cmd if isinstance(cmd, str) else list(cmd)
    if cwd:
        msg["cwd"] = cwd
    if env:
        msg["env"] = dict(env)
    return msg


def _control(msg: str) -> dict[str, Any]:
    """A text message of the terminal's protocol: a JSON object, else a
    ProtocolError (the daemon may have been replaced by the agent; aiohttp
    bounds a message at 4 MiB, the parser's depth is bounded here)."""
    try:
        doc = json.loads(msg)
    except (ValueError, RecursionError):
        raise ProtocolError(
            200, f"the terminal sent a message that is not JSON: {msg:.200}"
        ) from None
    if not isinstance(doc, dict):
        raise ProtocolError(200, f"the terminal sent a message that is not an object: {msg:.200}")
    return doc


def _error(doc: Mapping[str, Any]) -> DaemonError:
    err = doc.get("error") or {}
    return DaemonError(400, str(err.get("code", "error")), str(err.get("message", doc)))


class Terminal:
    """A program on a terminal in the sandbox; one reader task at a time.

    ``exit_code`` is set once the program exited (-N: killed by signal N).
    Closing (or leaving ``async with``) while it runs hangs the terminal up:
    the program gets SIGHUP, then SIGKILL.
    """

    def __init__(self, sock: DaemonSocket, pid: int) -> None:
        self._sock = sock
        self.pid = pid
        self.exit_code: int | None = None
        self.ended = False

    @classmethod
    async def open(cls, sock: DaemonSocket, start: Mapping[str, Any]) -> Terminal:
        try:
            await sock.send_text(json.dumps(dict(start)))
            msg = await sock.receive()
        except BaseException:
            await sock.close()
            raise
        try:
            doc = _control(msg) if isinstance(msg, str) else None
            if doc is not None and doc.get("type") == "error":
                raise _error(doc)
            if doc is None or doc.get("type") != "started":
                raise TransportError(f"the terminal did not start (got {msg!r:.200})")
            pid = int(doc["pid"])
        except (KeyError, TypeError, ValueError):
            await sock.close()
            raise ProtocolError(
                200, f"the terminal's start message has no pid: {msg!r:.200}"
            ) from None
        except BaseException:
            await sock.close()
            raise
        return cls(sock, pid)

    async def write(self, data: bytes | str) -> None:
        """Keystrokes (Ctrl-C is "\\x03": the program gets SIGINT from its terminal)."""
        await self._sock.send_bytes(data.encode() if isinstance(data, str) else data)

    async def resize(self, rows: int, cols: int) -> None:
        """The window changed: the program sees the new size (and SIGWINCH)."""
        await self._sock.send_text(json.dumps({"type": "resize", "rows": rows, "cols": cols}))

    async def read(self) -> bytes:
        """The next output, or b"" at the end (then ``exit_code`` says how it
        ended; None if the connection was lost before the program ended)."""
        while not self.ended:
            msg = await self._sock.receive()
            if isinstance(msg, bytes):
                if msg:
                    return msg
                continue
            if msg is None:
                self.ended = True
                break
            doc = _control(msg)
            if doc.get("type") == "exit":
                try:
                    self.exit_code = int(doc["exit_code"])
                except (KeyError, TypeError, ValueError):
                    raise ProtocolError(
                        200, f"an exit message without a code: {msg:.200}"
                    ) from None
            elif doc.get("type") == "error":
                raise _error(doc)
        return b""

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        while chunk := await self.read():
            yield chunk

    async def wait(self) -> int:
        """Read (and drop) output until the program exits; its exit code."""
        async for _ in self:
            pass
        if self.exit_code is None:
            raise TransportError("the terminal's connection ended before its program did")
        return self.exit_code

    async def close(self) -> None:
        await self._sock.close()

    async def __aenter__(self) -> Terminal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
