"""A small HTTP/1.1 server on asyncio's transports, for the daemon's API only.

Why not aiohttp: importing ``aiohttp.web`` cost the frozen daemon ~15 MiB of
resident memory and most of its start-up CPU (docs/performance.md has the
numbers), for features this API does not use. What the API needs, and this
module gives:

- keep-alive, pipelined requests answered in order, an idle timeout;
- request bodies streamed (``Content-Length`` or chunked, ``Expect:
  100-continue`` answered when the body is first read) with back-pressure:
  reading stops while the handler does not consume;
- responses with a body, or streamed (chunked) where ``write`` waits until the
  transport drained, so a slow client slows the producer instead of growing
  a buffer;
- a client that disconnects cancels its handler (a command nobody reads the
  result of is killed);
- limits on the request head, clean JSON errors for everything the client
  did wrong, never a traceback.

Protocol-level only: routing, auth and metrics are the app's (server.py).
Not thread-safe; everything runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, unquote

from sandman.daemon.errors import APIError, BadRequest, PayloadTooLarge

log = logging.getLogger("sandmand")

# A request line plus headers beyond this is refused (431). Real clients send
# < 1 KiB; 64 KiB is what aiohttp and nginx (4 x 8 KiB buffers ~ 32 KiB) allow
# give or take, and bounds what one connection can make us hold.
MAX_HEAD_BYTES = 64 << 10
MAX_HEADERS = 100
# Bytes buffered per connection before we stop reading from the socket; the
# handler consumes the body in chunks of about this size.
READ_HIGH_WATER = 256 << 10
# Transport write buffer above which `drain` waits (asyncio's default is 64 KiB).
WRITE_HIGH_WATER = 256 << 10
# An idle keep-alive connection is closed after this (aiohttp's default: 75 s).
KEEPALIVE_S = 75.0
# Unread request body the server still reads and drops so the connection can
# be reused; beyond it the connection is closed after the response.
MAX_DISCARD_BYTES = 1 << 20
# Closing while the client still sends makes the kernel answer with a RST,
# which can destroy the error response before the client read it (a 413 for
# a too-large upload). So the server first half-closes and reads on, dropping
# data, for at most this long and this much (RFC 7230 section 6.6).
LINGER_CLOSE_S = 2.0
LINGER_CLOSE_BYTES = 64 << 20

REASONS = {
    100: "Continue",
    101: "Switching Protocols",
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    411: "Length Required",
    413: "Payload Too Large",
    426: "Upgrade Required",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


# A chunk size: 1 to 16 hex digits (16 exabytes; anything longer is an attack).
_CHUNK_SIZE = re.compile(rb"[0-9a-fA-F]{1,16}")


class HeadTooLarge(APIError):
    status = 431
    code = "head_too_large"


class ConnectionClosed(Exception):
    """The peer went away (or the connection was closed) mid-read."""


class _Connection(asyncio.Protocol):
    """One TCP connection: a read buffer with back-pressure and a drainable writer."""

    def __init__(self, server: HTTPServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.eof = False
        self.lost = False
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._paused_reading = False
        self.task: asyncio.Task[None] | None = None
        self.busy = False  # a handler is running (cancel it if the peer leaves)

    # -- protocol callbacks ------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.task = asyncio.ensure_future(self.server.serve_connection(self))
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > READ_HIGH_WATER and not self._paused_reading and self.transport:
            self.transport.pause_reading()
            self._paused_reading = True
        self._wake()

    def eof_received(self) -> bool:
        # A client that closes its side has gone (as aiohttp treats it): the
        # transport closes, connection_lost cancels what it was waiting for.
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = self.eof = True
        self.server.connections.discard(self)
        self._wake()
        self.resume_writing()  # drain() wakes up and sees `lost`
        if self.busy and self.task is not None:
            self.task.cancel()  # nobody will read what the handler produces

    def pause_writing(self) -> None:
        if self._drain is None or self._drain.done():
            self._drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # -- reading -----------------------------------------------------------
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait_data(self) -> None:
        if self.eof:
            raise ConnectionClosed()
        if self._paused_reading and self.transport is not None:
            self._paused_reading = False
            self.transport.resume_reading()
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _consumed(self) -> None:
        if self._paused_reading and len(self.buf) <= READ_HIGH_WATER and self.transport:
            self._paused_reading = False
            self.transport.resume_reading()

    async def read_head(self) -> bytes | None:
        """The next request head (without the blank line); None on a clean EOF."""
        while True:
            i = self.buf.find(b"\r\n\r\n")
            if i > MAX_HEAD_BYTES:  # a whole but oversized head, arrived at once
                raise HeadTooLarge("request head too large")
            if i >= 0:
                head = bytes(self.buf[:i])
                del self.buf[: i + 4]
                self._consumed()
                return head
            if len(self.buf) > MAX_HEAD_BYTES:
                raise HeadTooLarge("request head too large")
            try:
                await self._wait_data()
            except ConnectionClosed:
                if self.buf.strip():
                    raise
                return None

    async def read_some(self, n: int) -> bytes:
        """Up to ``n`` bytes (at least one); ConnectionClosed at EOF."""
        while not self.buf:
            await self._wait_data()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        self._consumed()
        return data

    async def read_line(self, limit: int) -> bytes:
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 2]
                self._consumed()
                return line
            if len(self.buf) > limit:
                raise BadRequest("chunk header line too long")
            await self._wait_data()

    # -- writing -----------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.lost or self.transport is None:
            raise ConnectionClosed()
        self.transport.write(data)

    async def drain(self) -> None:
        if self.lost:
            raise ConnectionClosed()
        if self._drain is not None and not self._drain.done():
            await self._drain
            if self.lost:
                raise ConnectionClosed()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    async def linger_close(self) -> None:
        """Half-close, drop what the client still sends (bounded), then close."""
        if self.lost or self.transport is None:
            return
        with contextlib.suppress(OSError, RuntimeError):
            if self.transport.can_write_eof():
                self.transport.write_eof()
        dropped = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LINGER_CLOSE_S
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            while dropped < LINGER_CLOSE_BYTES:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                dropped += len(await asyncio.wait_for(self.read_some(1 << 20), remaining))
        self.close()


class Body:
    """A request body, read at most once, with the size cap enforced as it streams."""

    def __init__(self, conn: _Connection, length: int | None, chunked: bool, expect: bool) -> None:
        self._conn = conn
        self._left = length or 0
        self._chunked = chunked
        self._expect = expect
        self.done = not chunked and not length
        self._chunk_left = 0

    @property
    def consumed(self) -> bool:
        return self.done

    async def _continue(self) -> None:
        if self._expect:
            self._expect = False
            self._conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    async def read_chunk(self, n: int = READ_HIGH_WATER) -> bytes:
        """The next piece of the body (b"" at its end)."""
        if self.done:
            return b""
        await self._continue()
        try:
            if not self._chunked:
                data = await self._conn.read_some(min(n, self._left))
                self._left -= len(data)
                self.done = self._left == 0
                return data
            if self._chunk_left == 0:
                line = await self._conn.read_line(1024)
                size_text = line.split(b";", 1)[0].strip()
                # Hex digits only: int(x, 16) would also take "-1", "+5",
                # "0x10" and "1_0", which no sender means as a chunk size.
                if not _CHUNK_SIZE.fullmatch(size_text):
                    raise BadRequest("malformed chunked body (chunk size)")
                self._chunk_left = int(size_text, 16)
                if self._chunk_left == 0:
                    while await self._conn.read_line(8192):  # trailers, then the blank line
                        pass
                    self.done = True
                    return b""
            data = await self._conn.read_some(min(n, self._chunk_left))
            self._chunk_left -= len(data)
            if self._chunk_left == 0 and await self._conn.read_line(2) != b"":
                raise BadRequest("malformed chunked body")
            return data
        except ConnectionClosed:
            raise BadRequest("the request body ended early") from None

    async def chunks(self, limit: int) -> AsyncIterator[bytes]:
        total = 0
        while chunk := await self.read_chunk():
            total += len(chunk)
            if total > limit:
                raise PayloadTooLarge(f"request body over {limit} bytes")
            yield chunk

    async def read(self, limit: int) -> bytes:
        parts = [c async for c in self.chunks(limit)]
        return b"".join(parts)

    async def discard(self, limit: int) -> bool:
        """Read and drop what the handler left; False if over ``limit``."""
        if self.done:
            return True
        if self._expect:
            return False  # the client waits for 100 before sending: just close
        total = 0
        while chunk := await self.read_chunk():
            total += len(chunk)
            if total > limit:
                return False
        return True


class Request:
    __slots__ = (
        "body",
        "conn",
        "ctx",
        "headers",
        "match",
        "method",
        "path",
        "query",
        "raw_path",
        "started",
    )

    def __init__(
        self,
        method: str,
        raw_path: str,
        headers: dict[str, str],
        body: Body,
        conn: _Connection,
    ) -> None:
        self.method = method
        self.raw_path = raw_path
        path, _, qs = raw_path.partition("?")
        self.path = unquote(path)
        self.query = dict(parse_qsl(qs, keep_blank_values=True))
        self.headers = headers
        self.body = body
        self.conn = conn
        self.match: dict[str, str] = {}
        self.started = False  # a streamed response went out: errors can only close
        self.ctx: Any = None  # the app's state, set by its dispatcher

    @property
    def content_length(self) -> int | None:
        v = self.headers.get("content-length")
        return int(v) if v is not None and v.isdigit() else None


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Response:
    """A response whose body is known up front."""

    __slots__ = ("body", "headers", "status")

    def __init__(
        self,
        body: bytes = b"",
        status: int = 200,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.headers = {"Content-Type": content_type, **(headers or {})}

    def send(self, conn: _Connection, keep_alive: bool) -> None:
        headers = {**self.headers, "Content-Length": str(len(self.body))}
        if not keep_alive:
            headers["Connection"] = "close"
        conn.write(_head(self.status, headers) + self.body)


def json_response(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc).encode(), status)


def error_response(status: int, code: str, message: str) -> Response:
    return json_response({"error": {"code": code, "message": message}}, status)


class StreamResponse:
    """A response written piece by piece (chunked unless a length is given).

    ``write`` returns when the transport has room again: the handler produces
    only as fast as the client reads.
    """

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = dict(headers or {})
        self.prepared = False
        self.finished = False
        self._chunked = "Content-Length" not in self.headers
        self._conn: _Connection | None = None

    async def prepare(self, request: Request) -> None:
        self._conn = request.conn
        headers = dict(self.headers)
        if self._chunked:
            headers["Transfer-Encoding"] = "chunked"
        self._conn.write(_head(self.status, headers))
        self.prepared = request.started = True

    async def write(self, data: bytes) -> None:
        assert self._conn is not None, "prepare() first"
        if not data:
            return
        if self._chunked:
            self._conn.write(b"%x\r\n" % len(data) + data + b"\r\n")
        else:
            self._conn.write(data)
        await self._conn.drain()

    async def write_eof(self) -> None:
        assert self._conn is not None, "prepare() first"
        if self.finished:
            return
        self.finished = True
        if self._chunked:
            self._conn.write(b"0\r\n\r\n")
        await self._conn.drain()


Handler = Callable[[Request], Awaitable["Response | StreamResponse | Upgraded"]]


class Upgraded:
    """The handler took the connection over (e.g. a WebSocket); it is closed after."""


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes everything
        raise BadRequest("undecodable request head") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"malformed request line {lines[0][:100]!r}")
    method, target, version = parts
    if not method.isalpha() or not target.startswith("/"):
        raise BadRequest(f"malformed request line {lines[0][:100]!r}")
    if len(lines) - 1 > MAX_HEADERS:
        raise HeadTooLarge(f"more than {MAX_HEADERS} headers")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(f"malformed header line {line[:100]!r}")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return method, target, version, headers


class HTTPServer:
    """Serves ``dispatch`` on one listening socket; see the module docstring."""

    def __init__(
        self,
        dispatch: Handler,
        *,
        max_connections: int = 1024,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        self.dispatch = dispatch
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self.connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int, backlog: int = 1024) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, reuse_address=True, backlog=backlog
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop accepting; let requests in flight finish (bounded), then close all."""
        if self._server is not None:
            self._server.close()
        deadline = asyncio.get_running_loop().time() + grace_s
        while any(c.busy for c in self.connections):
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.02)
        for c in list(self.connections):
            c.close()
            if c.task is not None:
                c.task.cancel()
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def in_flight(self) -> int:
        return sum(1 for c in self.connections if c.busy)

    async def serve_connection(self, conn: _Connection) -> None:
        try:
            if len(self.connections) > self.max_connections:
                error_response(503, "too_many_connections", "too many connections").send(
                    conn, False
                )
                return
            while await self._one_request(conn):
                pass
        except (ConnectionClosed, asyncio.CancelledError):
            pass
        except Exception:  # a bug in here must not kill the server
            log.exception("connection error")
        finally:
            conn.close()

    async def _one_request(self, conn: _Connection) -> bool:
        """Serve one request; False when the connection should close."""
        try:
            head = await asyncio.wait_for(conn.read_head(), self.keepalive_s)
        except TimeoutError:
            return False
        except APIError as e:
            error_response(431, e.code, e.message).send(conn, False)
            return False
        if head is None:
            return False
        try:
            method, target, version, headers = _parse_head(head)
            te = headers.get("transfer-encoding", "").lower()
            cl = headers.get("content-length")
            if te and te != "chunked":
                raise APIError(f"transfer-encoding {te!r} is not supported", code="bad_request")
            if cl is not None and (not cl.isdigit() or te):
                raise BadRequest("invalid Content-Length")
        except APIError as e:
            error_response(400 if e.status == 500 else e.status, e.code, e.message).send(
                conn, False
            )
            return False
        keep_alive = (
            headers.get("connection", "").lower() != "close"
            if version == "HTTP/1.1"
            else headers.get("connection", "").lower() == "keep-alive"
        )
        expect = headers.get("expect", "").lower() == "100-continue"
        body = Body(conn, int(cl) if cl else None, te == "chunked", expect)
        request = Request(method, target, headers, body, conn)
        conn.busy = True
        try:
            resp = await self.dispatch(request)
        finally:
            conn.busy = False
        if isinstance(resp, Upgraded):
            return False
        if isinstance(resp, StreamResponse):
            if not resp.finished:
                return False  # a handler that stopped mid-stream: end the connection
        else:
            if not body.consumed:
                # Answer first (the client may be waiting for 100-continue),
                # then drop the rest of the body if it is small enough.
                keep_alive = keep_alive and not body._expect
            resp.send(conn, keep_alive)
            await conn.drain()
        if keep_alive:
            with contextlib.suppress(APIError):
                if await body.discard(MAX_DISCARD_BYTES):
                    return True
        if not body.consumed:
            await conn.linger_close()
        return False


class Router:
    """Method + path to handler; ``{name}`` segments match one path segment."""

    def __init__(self) -> None:
        self._static: dict[str, dict[str, Handler]] = {}
        self._patterns: list[tuple[tuple[str, ...], str, dict[str, Handler]]] = []

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        if "{" not in pattern:
            self._static.setdefault(pattern, {})[method] = handler
            return
        parts = tuple(pattern.strip("/").split("/"))
        for p, _, methods in self._patterns:
            if p == parts:
                methods[method] = handler
                return
        self._patterns.append((parts, pattern, {method: handler}))

    def resolve(
        self, method: str, path: str
    ) -> tuple[str | None, dict[str, Handler], dict[str, str]]:
        """(route pattern or None, handlers by method, matched segments)."""
        methods = self._static.get(path)
        if methods is not None:
            return path, methods, {}
        segs = path.strip("/").split("/")
        for parts, pattern, methods in self._patterns:
            if len(parts) != len(segs):
                continue
            match = {}
            for want, got in zip(parts, segs, strict=True):
                if want.startswith("{"):
                    if not got:
                        break
                    match[want[1:-1]] = got
                elif want != got:
                    break
            else:
                return pattern, methods, match
        return None, {}, {}
