"""The server side of RFC 6455 WebSockets on the daemon's own HTTP connection.

Only what the interactive terminal (``/v1/pty``) needs: the opening
handshake, masked client frames (fragmented messages reassembled, ping
answered, close echoed), unmasked server frames, a size cap per message.
No extensions (``permessage-deflate`` is never negotiated), no subprotocols.

Why a WebSocket and not a bare ``Upgrade``: the apiserver's ``pods/proxy``
passes any HTTP upgrade through (it dials the pod and splices the two
connections once the pod answers 101), but client libraries (aiohttp,
browsers, ``websocat``) and other proxies on the way (ingress controllers,
``kubectl proxy``) speak WebSocket, not a private protocol.

Imported only when a terminal is opened (hashlib's SHA-1 is built into the
runtime tree's interpreter).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import struct

from sandman.daemon.errors import APIError, BadRequest
from sandman.daemon.http import ConnectionClosed, Request, _head

# RFC 6455 section 1.3: appended to the client's key before hashing.
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
# Close codes (RFC 6455 section 7.4.1).
NORMAL, GOING_AWAY, PROTOCOL_ERROR, POLICY, TOO_BIG, INTERNAL = 1000, 1001, 1002, 1008, 1009, 1011

# A terminal's input is keystrokes and pastes; 1 MiB per message is a large
# paste, and bounds what one client can make the daemon hold.
MAX_MESSAGE_BYTES = 1 << 20


class WebSocketClosed(Exception):
    """The peer closed the WebSocket (``code``), or the connection went away."""

    def __init__(self, code: int = GOING_AWAY, reason: str = "") -> None:
        super().__init__(f"websocket closed ({code}) {reason}".strip())
        self.code = code
        self.reason = reason


class UpgradeRequired(APIError):
    status = 426
    code = "upgrade_required"


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()


def check_handshake(request: Request) -> str:
    """The client's Sec-WebSocket-Key, or an HTTP error (sent before any 101)."""
    h = request.headers
    if request.method != "GET":
        raise BadRequest("a WebSocket opens with GET")
    if h.get("upgrade", "").lower() != "websocket" or "upgrade" not in [
        t.strip() for t in h.get("connection", "").lower().split(",")
    ]:
        raise UpgradeRequired(
            f"{request.path} is a WebSocket: send Connection: Upgrade and Upgrade: websocket"
        )
    if h.get("sec-websocket-version") != "13":
        raise UpgradeRequired("only WebSocket version 13 is spoken")
    key = h.get("sec-websocket-key", "")
    try:
        if len(base64.b64decode(key, validate=True)) != 16:
            raise ValueError
    except ValueError:
        raise BadRequest("Sec-WebSocket-Key must be 16 bytes in base64") from None
    return key


def unmask(payload: bytes, mask: bytes) -> bytes:
    """XOR with the repeated 4-byte mask (as one big integer: C speed, no loop)."""
    n = len(payload)
    if not n:
        return payload
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


class WebSocket:
    """One accepted WebSocket on the request's connection (event loop only)."""

    def __init__(self, request: Request, max_message: int = MAX_MESSAGE_BYTES) -> None:
        self._conn = request.conn
        self._request = request
        self.max_message = max_message
        self.closed = False  # a close frame went out

    async def accept(self, key: str) -> None:
        headers = {
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Accept": accept_key(key),
        }
        self._conn.write(_head(101, headers))
        # From here on errors cannot be an HTTP answer any more.
        self._request.started = True
        await self._conn.drain()

    # -- reading -----------------------------------------------------------
    async def _exactly(self, n: int) -> bytes:
        parts, left = [], n
        while left:
            chunk = await self._conn.read_some(left)
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    async def _frame(self) -> tuple[bool, int, bytes]:
        b0, b1 = await self._exactly(2)
        fin, rsv, opcode = bool(b0 & 0x80), b0 & 0x70, b0 & 0x0F
        masked, length = bool(b1 & 0x80), b1 & 0x7F
        if rsv:
            raise WebSocketClosed(PROTOCOL_ERROR, "reserved bits set (no extension was agreed)")
        if not masked:
            raise WebSocketClosed(PROTOCOL_ERROR, "client frames must be masked")
        if length == 126:
            (length,) = struct.unpack("!H", await self._exactly(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", await self._exactly(8))
        if opcode >= CLOSE and (length > 125 or not fin):
            raise WebSocketClosed(PROTOCOL_ERROR, "control frames are short and unfragmented")
        if length > self.max_message:
            raise WebSocketClosed(TOO_BIG, f"messages are at most {self.max_message} bytes")
        mask = await self._exactly(4)
        return fin, opcode, unmask(await self._exactly(length), mask)

    async def receive(self) -> tuple[int, bytes]:
        """The next data message: (TEXT or BINARY, payload). Pings are answered
        here; a close frame (or a lost connection) raises WebSocketClosed."""
        opcode, parts, size = None, [], 0
        try:
            while True:
                fin, op, payload = await self._frame()
                if op == PING:
                    await self._send_frame(PONG, payload)
                    continue
                if op == PONG:
                    continue
                if op == CLOSE:
                    code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else NORMAL
                    await self.close(code if code in (NORMAL, GOING_AWAY) else NORMAL)
                    raise WebSocketClosed(code, payload[2:].decode(errors="replace"))
                if op in (TEXT, BINARY):
                    if opcode is not None:
                        raise WebSocketClosed(
                            PROTOCOL_ERROR, "a new message inside a fragmented one"
                        )
                    opcode = op
                elif op == CONT:
                    if opcode is None:
                        raise WebSocketClosed(PROTOCOL_ERROR, "continuation without a message")
                else:
                    raise WebSocketClosed(PROTOCOL_ERROR, f"unknown opcode {op:#x}")
                size += len(payload)
                if size > self.max_message:
                    raise WebSocketClosed(TOO_BIG, f"messages are at most {self.max_message} bytes")
                parts.append(payload)
                if fin:
                    return opcode, b"".join(parts)
        except ConnectionClosed:
            raise WebSocketClosed(GOING_AWAY, "the connection went away") from None
        except WebSocketClosed as e:
            if e.code in (PROTOCOL_ERROR, TOO_BIG):
                await self.close(e.code, e.reason)
            raise

    # -- writing -----------------------------------------------------------
    async def _send_frame(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
        try:
            self._conn.write(head + payload)
            # Returns when the client has taken it: output is produced no
            # faster than the client reads (back-pressure).
            await self._conn.drain()
        except ConnectionClosed:
            raise WebSocketClosed(GOING_AWAY, "the connection went away") from None

    async def send_bytes(self, data: bytes) -> None:
        await self._send_frame(BINARY, data)

    async def send_text(self, text: str) -> None:
        await self._send_frame(TEXT, text.encode())

    async def close(self, code: int = NORMAL, reason: str = "") -> None:
        """Send a close frame, then half-close and drop what the client still
        sends until it closes too (bounded): closing at once while keystrokes
        are in flight would make the kernel answer with a reset, which can
        destroy the last output and the exit message before the client read
        them. MUST NOT run while another task reads this connection."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(WebSocketClosed):
            await self._send_frame(CLOSE, struct.pack("!H", code) + reason.encode()[:120])
        await self._conn.linger_close()
