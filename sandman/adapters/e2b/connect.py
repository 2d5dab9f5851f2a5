"""The Connect RPC protocol (JSON codec) on aiohttp: what E2B's SDK speaks to envd.

Only what envd's clients use: unary calls (``POST /pkg.Service/Method`` with
``application/json``) and server streams (``application/connect+json``: a
request envelope, then response envelopes and an end-of-stream envelope
carrying the error, if any). Envelopes are a flags byte (1 = compressed,
2 = end of stream) and a big-endian 32-bit length. Compression is not
offered, so clients send none (they only compress when the server says it
accepts it). Spec: connectrpc.com/docs/protocol.

Handlers take the request message as a dict (protobuf JSON) and return one,
or yield many; they raise ``ConnectError(code, message)`` for RPC errors,
which become Connect error JSON on one channel only (HTTP status for unary
calls, the end-of-stream envelope for streams).

Every call is authenticated before its body is read (``authenticate``), and
the body is read with a running count: a client without the sandbox's token
makes the server read nothing, and one with it at most ``MAX_MESSAGE_BYTES``,
whatever its Content-Length says or whether it sends one (chunked).
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

UNARY_JSON = "application/json"
STREAM_JSON = "application/connect+json"
END_STREAM = 0b10
COMPRESSED = 0b01
# envd's requests are small (a command line, a path); a bound keeps a
# misbehaving client from making the gateway buffer without limit.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# A request body over MAX_MESSAGE_BYTES: refused with HTTP's own status for
# it (a unary call's status says so; Connect clients read the code).
TOO_LARGE_STATUS = 413

# Connect code -> HTTP status of a unary error (the protocol's table).
HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


class ConnectError(Exception):
    """An RPC error with a Connect code (a key of HTTP_STATUS); ``status``
    overrides the code's HTTP status of a unary answer."""

    def __init__(self, code: str, message: str, *, status: int | None = None) -> None:
        if code not in HTTP_STATUS:
            raise ValueError(f"unknown Connect code {code!r}")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status or HTTP_STATUS[code]

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def envelope(message: Mapping[str, Any], *, flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_envelope(error: ConnectError | None) -> bytes:
    return envelope({"error": error.to_json()} if error else {}, flags=END_STREAM)


def read_envelope(body: bytes) -> dict[str, Any]:
    """The single request message of a server-stream call."""
    if len(body) < 5:
        raise ConnectError("invalid_argument", "stream request: no envelope")
    flags, length = struct.unpack(">BI", body[:5])
    if flags & COMPRESSED:
        raise ConnectError("unimplemented", "compressed messages are not supported")
    if len(body) != 5 + length:
        raise ConnectError("invalid_argument", "stream request: expected exactly one message")
    return parse_message(body[5:])


def parse_message(data: bytes) -> dict[str, Any]:
    if not data:
        return {}
    try:
        msg = json.loads(data)
    except ValueError as e:
        raise ConnectError("invalid_argument", f"request is not JSON: {e}") from None
    except RecursionError:
        raise ConnectError("invalid_argument", "request JSON is nested too deep") from None
    if not isinstance(msg, dict):
        raise ConnectError("invalid_argument", "request must be a JSON object")
    return msg


@dataclass(frozen=True)
class Call:
    """What a handler may look at besides the message."""

    request: web.Request
    timeout_ms: int | None  # connect-timeout-ms: the call's deadline

    @property
    def headers(self) -> Mapping[str, str]:
        return self.request.headers

    def client_gone(self) -> bool:
        """The client closed the connection (a stream can stop waiting for output)."""
        transport = self.request.transport
        return transport is None or transport.is_closing()


Unary = Callable[[Call, dict[str, Any]], Awaitable[dict[str, Any]]]
ServerStream = Callable[[Call, dict[str, Any]], AsyncIterator[dict[str, Any]]]
# Checks a request's credentials from its headers alone (raises ConnectError
# "unauthenticated"); runs before any byte of the body is read.
Authenticate = Callable[[web.Request], object]


def _no_auth(_request: web.Request) -> None:
    return None


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request's body, counted as it arrives: ConnectError
    ``resource_exhausted`` (HTTP 413) once it passes ``limit``, with the rest
    left unread. Content-Length is only a shortcut: a chunked body is counted
    the same way."""
    too_large = ConnectError(
        "resource_exhausted",
        f"the request body is over {limit} bytes, the bound of this call",
        status=TOO_LARGE_STATUS,
    )
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    body = bytearray()
    while chunk := await request.content.readany():
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


def _timeout_ms(request: web.Request) -> int | None:
    raw = request.headers.get("connect-timeout-ms")
    if not raw:
        return None
    if len(raw) > 10 or not raw.isdigit():
        raise ConnectError("invalid_argument", f"bad connect-timeout-ms {raw!r}")
    return int(raw)


def _check_codec(request: web.Request, want: str) -> None:
    ctype = request.headers.get("Content-Type", "").partition(";")[0].strip().lower()
    if ctype != want:
        raise ConnectError(
            "unimplemented", f"content type {ctype or '-'} not supported; this server speaks {want}"
        )
    if request.headers.get("connect-content-encoding", "identity") != "identity":
        raise ConnectError("unimplemented", "compressed streams are not supported")


def unary_route(
    handler: Unary, authenticate: Authenticate = _no_auth
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def route(request: web.Request) -> web.StreamResponse:
        try:
            authenticate(request)  # MUST come first: nothing is read for a stranger
            _check_codec(request, UNARY_JSON)
            call = Call(request, _timeout_ms(request))
            message = parse_message(await read_body(request, MAX_MESSAGE_BYTES))
            reply = await handler(call, message)
        except ConnectError as e:
            return web.json_response(e.to_json(), status=e.status)
        return web.json_response(reply)

    return route


def stream_route(
    handler: ServerStream, authenticate: Authenticate = _no_auth
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def route(request: web.Request) -> web.StreamResponse:
        try:
            authenticate(request)  # MUST come first: nothing is read for a stranger
            _check_codec(request, STREAM_JSON)
            call = Call(request, _timeout_ms(request))
            message = read_envelope(await read_body(request, MAX_MESSAGE_BYTES + 5))
        except ConnectError as e:
            # Errors before the stream starts are still sent as a stream (status 200):
            # that is what Connect clients expect of a streaming call.
            return web.Response(body=end_envelope(e), content_type=STREAM_JSON)
        resp = web.StreamResponse(headers={"Content-Type": STREAM_JSON})
        await resp.prepare(request)
        error: ConnectError | None = None
        replies = handler(call, message)
        try:
            async for reply in replies:
                await resp.write(envelope(reply))
        except ConnectError as e:
            error = e
        except (ConnectionResetError, OSError):
            return resp  # the client went away: nobody is left to tell
        finally:
            # MUST close the handler now, not whenever it is collected: its
            # cleanup (a command's stream detaching) decides when the command's
            # record may be deleted.
            await replies.aclose()
        await resp.write(end_envelope(error))
        await resp.write_eof()
        return resp

    return route


def routes(
    service: str,
    unary: Mapping[str, Unary],
    streams: Mapping[str, ServerStream],
    unimplemented: tuple[str, ...] = (),
    authenticate: Authenticate = _no_auth,
) -> list[web.RouteDef]:
    """aiohttp routes of one service; methods it does not offer answer
    ``unimplemented``. ``authenticate`` runs first on every route."""
    out = [web.post(f"/{service}/{m}", unary_route(h, authenticate)) for m, h in unary.items()]
    out += [web.post(f"/{service}/{m}", stream_route(h, authenticate)) for m, h in streams.items()]
    for method in unimplemented:
        out.append(web.post(f"/{service}/{method}", _unimplemented(service, method, authenticate)))
    return out


def _unimplemented(
    service: str, method: str, authenticate: Authenticate
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def route(request: web.Request) -> web.Response:
        try:
            authenticate(request)
            raise ConnectError("unimplemented", f"{service}/{method} is not supported by Sandman")
        except ConnectError as err:
            ctype = request.headers.get("Content-Type", "")
            if ctype.startswith("application/connect+"):
                return web.Response(body=end_envelope(err), content_type=STREAM_JSON)
            return web.json_response(err.to_json(), status=err.status)

    return route
