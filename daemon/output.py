"""Byte plumbing: pipe pumps, capped captures, rings and binary-safe encoding."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import Awaitable, Callable

READ_CHUNK = 64 << 10  # one pipe buffer's worth (Linux default 64 KiB)


# After a command exits, its pipes may be held open by a backgrounded
# grandchild (`server &`): read on for this long while data keeps coming, then
# stop (200 ms lets output already in flight arrive and costs nothing for
# commands that close their pipes), and never more than LINGER_BYTES after
# the exit (a lingering `yes &` must not hold the call open).
LINGER_S = 0.2
LINGER_BYTES = 4 << 20


async def pump(
    fd: int,
    on_data: Callable[[bytes], Awaitable[None] | None],
    exited: asyncio.Future[int] | None = None,
    linger_s: float = LINGER_S,
) -> None:
    """Read a non-blocking fd until EOF, handing each chunk to ``on_data``.

    When ``on_data`` returns an awaitable, the next read waits for it: a
    streamed command is read only as fast as its client takes the output
    (back-pressure: the command blocks on a full pipe instead of the daemon
    buffering without bound). A plain callable (a capture past its cap)
    keeps reading: a command blocked on a full pipe would never exit.
    With ``exited`` (the command's exit), reading stops ``linger_s`` after the
    exit once no data is waiting, or after LINGER_BYTES more.
    """
    loop = asyncio.get_running_loop()
    waiter: list[asyncio.Future[None] | None] = [None]
    exit_at: list[float | None] = [None]

    def wake() -> None:
        fut = waiter[0]
        if fut is not None and not fut.done():
            fut.set_result(None)

    def on_exit(_: object) -> None:
        exit_at[0] = loop.time()
        loop.call_later(linger_s, wake)

    if exited is not None:
        exited.add_done_callback(on_exit)
    after_exit = 0
    try:
        while True:
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                if exit_at[0] is not None and loop.time() >= exit_at[0] + linger_s:
                    return
                fut = loop.create_future()
                waiter[0] = fut
                loop.add_reader(fd, wake)
                try:
                    await fut
                finally:
                    loop.remove_reader(fd)
                    waiter[0] = None
                continue
            except OSError:
                data = b""
            if not data:
                return
            if exit_at[0] is not None:
                after_exit += len(data)
                if after_exit > LINGER_BYTES:
                    return
            pending = on_data(data)
            if pending is not None:
                await pending
    finally:
        if exited is not None:
            exited.remove_done_callback(on_exit)
        with contextlib.suppress(OSError):
            os.close(fd)


async def feed(fd: int, data: bytes) -> None:
    """Write ``data`` to a non-blocking fd, then close it (EOF for the reader)."""
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    try:
        while view:
            try:
                n = os.write(fd, view)
                view = view[n:]
            except BlockingIOError:
                writable: asyncio.Future[None] = loop.create_future()
                loop.add_writer(fd, writable.set_result, None)
                try:
                    await writable
                finally:
                    loop.remove_writer(fd)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the command stopped reading; that is its business
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


class Capture:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._parts: list[bytes] = []
        self._kept = 0
        self.total = 0

    def __call__(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - self._kept
        if room > 0:
            part = data[:room]
            self._parts.append(part)
            self._kept += len(part)

    @property
    def truncated(self) -> bool:
        return self.total > self._kept

    def value(self) -> bytes:
        return b"".join(self._parts)


class Ring:
    """The last ``capacity`` bytes of a stream, addressed by absolute offset.

    Clients re-read background output from any offset they saw; what fell out
    of the ring is reported as ``dropped`` instead of silently skipped. Not
    thread-safe (event loop only).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._buf = bytearray()
        self._start = 0  # absolute offset of _buf[0]
        self._changed = asyncio.Event()

    @property
    def end(self) -> int:
        return self._start + len(self._buf)

    def __call__(self, data: bytes) -> None:
        self._buf += data
        excess = len(self._buf) - self.capacity
        if excess > 0:
            del self._buf[:excess]
            self._start += excess
        self._changed.set()

    def read(self, offset: int, limit: int) -> tuple[bytes, int, int]:
        """(data, offset of data[0], bytes dropped before it) from ``offset`` on."""
        offset = max(0, offset)
        dropped = max(0, self._start - offset)
        begin = max(offset, self._start) - self._start
        data = bytes(self._buf[begin : begin + max(0, limit)])
        return data, max(offset, self._start), dropped

    async def wait_beyond(self, offset: int, timeout: float) -> None:
        """Return when data past ``offset`` exists, or after ``timeout``."""
        if self.end > offset:
            return
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    def wake(self) -> None:
        self._changed.set()


def encode(data: bytes, *, truncated: bool = False) -> tuple[str, str]:
    """(text, encoding): UTF-8 text when the bytes are UTF-8, else base64."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    if truncated:
        # The cap may have cut a multi-byte character in two: do not turn a
        # whole UTF-8 output into base64 for its last 1-3 bytes.
        for cut in (1, 2, 3):
            try:
                return data[:-cut].decode("utf-8"), "utf-8"
            except UnicodeDecodeError:
                continue
    return base64.b64encode(data).decode("ascii"), "base64"


def decode(text: str, encoding: str) -> bytes:
    if encoding == "base64":
        return base64.b64decode(text, validate=True)
    return text.encode("utf-8")
