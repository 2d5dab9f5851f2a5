"""envd, the E2B in-sandbox API, served over each sandbox's Sandman daemon.

Connect RPC services ``process.Process`` (Start, Connect, List, SendSignal,
SendInput, CloseStdin) and ``filesystem.Filesystem`` (Stat, ListDir, MakeDir,
Move, Remove), plus ``GET/POST /files`` and ``GET /health``. PTYs, stdin
streams and directory watches answer ``unimplemented`` (the daemon has no
terminal and no inotify); docs/adapters.md lists every difference.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from aiohttp import web

from sandman.adapters.e2b import wire
from sandman.adapters.e2b.connect import TOO_LARGE_STATUS, Call, ConnectError
from sandman.adapters.e2b.connect import routes as connect_routes
from sandman.adapters.e2b.gateway import GATEWAY, SANDBOX_ID_HEADER, Entry, Gateway
from sandman.adapters.e2b.processes import Tracked, process_config, stream_events
from sandman.client import (
    DaemonError,
    ResponseTooLarge,
    SandboxGone,
    SandmanError,
    TransportError,
)

log = logging.getLogger(__name__)

# Daemon error (status, code) -> Connect code; what is not listed is "internal".
_CODES = {
    (409, "exists"): "already_exists",
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "failed_precondition",
    413: "resource_exhausted",
    503: "unavailable",
}
# envd asks the SDK for a keepalive every `Keepalive-Ping-Interval` seconds
# (the SDK sends 50); without the header a stream gets none.
KEEPALIVE_HEADER = "Keepalive-Ping-Interval"


@contextlib.contextmanager
def rpc_errors() -> Iterator[None]:
    """Sandman errors as Connect errors (one table, one place)."""
    try:
        yield
    except SandboxGone as e:
        raise ConnectError("not_found", str(e)) from None
    except TransportError as e:
        raise ConnectError("unavailable", str(e)) from None
    except ResponseTooLarge as e:
        raise ConnectError("resource_exhausted", e.message) from None
    except DaemonError as e:
        code = _CODES.get((e.status, e.code)) or _CODES.get(e.status, "internal")
        raise ConnectError(code, e.message) from None
    except SandmanError as e:
        raise ConnectError("internal", str(e)) from None


async def _entry(call: Call) -> tuple[Gateway, Entry]:
    gw = call.request.app[GATEWAY]
    sid = gw.envd_sandbox(call.headers)
    with rpc_errors():
        return gw, await gw.entry(sid)


async def _path(gw: Gateway, entry: Entry, msg: dict[str, Any], key: str = "path") -> str:
    with rpc_errors():
        return wire.absolute(str(msg.get(key) or ""), await gw.home(entry))


# -- process.Process ------------------------------------------------------------------
async def start(call: Call, msg: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    gw, entry = await _entry(call)
    if msg.get("pty"):
        raise ConnectError("unimplemented", "PTY commands are not supported by Sandman")
    cfg = process_config(msg)
    with rpc_errors():
        cwd = cfg.get("cwd") or await gw.home(entry)
        proc = await entry.sandbox.start(
            [cfg["cmd"], *cfg["args"]], cwd=cwd, env=cfg["envs"], stdin=bool(msg.get("stdin"))
        )
    tracked = Tracked(proc, cfg, msg.get("tag") or None)
    timeout_s = call.timeout_ms / 1000 if call.timeout_ms else None  # 0 or none: no limit
    entry.processes.add(tracked, timeout_s)  # attached for this stream
    try:
        yield wire.start_event(tracked.pid)
        with rpc_errors():
            async for event in stream_events(tracked, **_stream_opts(call, from_now=False)):
                yield event
    finally:
        tracked.detach()


async def connect(call: Call, msg: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    _, entry = await _entry(call)
    tracked = entry.processes.get(*wire.selector(msg))
    tracked.attach()
    try:
        yield wire.start_event(tracked.pid)
        with rpc_errors():
            async for event in stream_events(tracked, **_stream_opts(call, from_now=True)):
                yield event
    finally:
        tracked.detach()


def _stream_opts(call: Call, *, from_now: bool) -> dict[str, Any]:
    return {
        "keepalive_s": wire.keepalive_seconds(call.headers.get(KEEPALIVE_HEADER, "")),
        "from_now": from_now,
        "clock": time.monotonic,
        "client_gone": call.client_gone,
    }


async def list_processes(call: Call, msg: dict[str, Any]) -> dict[str, Any]:
    _, entry = await _entry(call)
    return {
        "processes": [wire.process_info(t.pid, t.config, t.tag) for t in entry.processes.running()]
    }


async def send_signal(call: Call, msg: dict[str, Any]) -> dict[str, Any]:
    _, entry = await _entry(call)
    tracked = entry.processes.get(*wire.selector(msg))
    with rpc_errors():
        await tracked.process.signal(wire.signal_name(msg.get("signal")))
    return {}


async def send_input(call: Call, msg: dict[str, Any]) -> dict[str, Any]:
    _, entry = await _entry(call)
    tracked = entry.processes.get(*wire.selector(msg))
    data = msg.get("input") or {}
    if "pty" in data:
        raise ConnectError("unimplemented", "PTY input is not supported by Sandman")
    try:
        text = base64.b64decode(data.get("stdin") or "").decode()
    except (ValueError, UnicodeDecodeError):
        raise ConnectError("invalid_argument", "stdin must be UTF-8 text") from None
    with rpc_errors():
        await tracked.process.write(text)
    return {}


async def close_stdin(call: Call, msg: dict[str, Any]) -> dict[str, Any]:
    _, entry = await _entry(call)
    tracked = entry.processes.get(*wire.selector(msg))
    with rpc_errors():
        await tracked.process.write("", eof=True)
    return {}


# -- filesystem.Filesystem ----------------------------------------------------------------
async def stat(call: Call, msg: dict[str, Any]) -> dict[str, Any]:
    gw, entry = await _entry(call)
    path = await _path(gw, entry, msg)
    with rpc_errors():
        return {"entry": wire.entry_info(await entry.sandbox.stat(path))}


async def list_dir(call: Call, msg: dict[str, Any]) -> dict[str, Any]:
    gw, entry = await _entry(call)
    path = await _path(gw, entry, msg)
    depth = wire.list_depth(msg)
    out: list[dict[str, Any]] = []

    async def walk(directory: str, level: int) -> None:
        for st in await entry.sandbox.list_dir(directory):
            out.append(wire.entry_info(st))
            if st["type"] == "dir" and level < depth:
                await walk(st["path"], level + 1)

    with rpc_errors():
        await walk(path, 1)
    return {"entries": out}


async def make_dir(call: Call, msg: dict[str, Any]) -> dict[str, Any]:
    gw, entry = await _entry(call)
    path = await _path(gw, entry, msg)
    with rpc_errors():
        try:
            await entry.sandbox.stat(path)
        except DaemonError as e:
            if e.status != 404:
                raise
        else:
            raise ConnectError("already_exists", f"{path} already exists")
        await entry.sandbox.mkdir(path)
        return {"entry": wire.entry_info(await entry.sandbox.stat(path))}


async def move(call: Call, msg: dict[str, Any]) -> dict[str, Any]:
    gw, entry = await _entry(call)
    src = await _path(gw, entry, msg, "source")
    dst = await _path(gw, entry, msg, "destination")
    with rpc_errors():
        await entry.sandbox.move(src, dst, overwrite=True)  # envd renames over a file
        return {"entry": wire.entry_info(await entry.sandbox.stat(dst))}


async def remove(call: Call, msg: dict[str, Any]) -> dict[str, Any]:
    gw, entry = await _entry(call)
    path = await _path(gw, entry, msg)
    with rpc_errors():
        await entry.sandbox.remove(path, recursive=True)
    return {}


# -- plain HTTP: /files and /health -----------------------------------------------------------
_HTTP_STATUS = {"not_found": 404, "already_exists": 409, "permission_denied": 403,
                "invalid_argument": 400, "unauthenticated": 401, "unavailable": 502,
                "resource_exhausted": TOO_LARGE_STATUS}  # fmt: skip


def _http_error(e: ConnectError) -> web.Response:
    status = _HTTP_STATUS.get(e.code, 500)
    return web.json_response({"code": status, "message": e.message}, status=status)


async def _http_entry(request: web.Request) -> tuple[Gateway, Entry]:
    gw = request.app[GATEWAY]
    sid = gw.envd_sandbox(request.headers)
    with rpc_errors():
        return gw, await gw.entry(sid)


async def files_get(request: web.Request) -> web.StreamResponse:
    """The file, streamed from the daemon to the client a chunk at a time:
    the gateway never holds a whole file, whatever its size."""
    try:
        gw, entry = await _http_entry(request)
        path = await _path(gw, entry, dict(request.query))
        chunks = entry.sandbox.read_file_chunks(path)
        with rpc_errors():
            first = await anext(chunks, b"")  # the daemon's error, before any byte goes out
    except ConnectError as e:
        return _http_error(e)
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        resp.enable_compression()
    await resp.prepare(request)
    try:
        await resp.write(first)
        async for chunk in chunks:
            await resp.write(chunk)
    except SandmanError as e:
        # The daemon cut the file short: cut the client's answer too (no last
        # chunk), never an end that makes a short file look whole.
        log.warning("GET /files %s: the daemon's answer broke off: %s", path, e)
        request.protocol.force_close()
        return resp
    finally:
        await chunks.aclose()
    await resp.write_eof()
    return resp


async def files_post(request: web.Request) -> web.Response:
    try:
        if any(h.lower().startswith("x-metadata-") for h in request.headers):
            raise ConnectError("invalid_argument", "file metadata is not supported by Sandman")
        gw, entry = await _http_entry(request)  # MUST come first: nothing is read for a stranger
        written = []
        for name, data in await _uploads(request, gw.config.max_upload_bytes):
            path = await _path(gw, entry, {"path": name})
            with rpc_errors():
                await entry.sandbox.write_file(path, data, mkdirs=True)
            written.append(wire.write_info(path))
    except ConnectError as e:
        return _http_error(e)
    return web.json_response(written)


async def _uploads(request: web.Request, limit: int) -> list[tuple[str, bytes]]:
    """(path, bytes) of each file in a multipart or octet-stream upload.

    The bytes are the file as the client had it: aiohttp undoes the body's
    Content-Encoding once, as it arrives (a gzip upload), and nothing is
    decoded again, so a ``.gz`` file stays a ``.gz`` file. Every file counts
    against ``limit`` as it streams in, after that one decoding (a gzip bomb
    stops there).
    """
    query_path = request.query.get("path", "")
    if request.content_type == "multipart/form-data":
        files = []
        total = 0
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if getattr(part, "name", None) != "file":
                continue
            data = bytearray()
            while chunk := await part.read_chunk():  # type: ignore[union-attr]
                data += chunk
                if total + len(data) > limit:
                    raise _upload_too_large(limit)
            total += len(data)
            name = wire.disposition_filename(part.headers.get("Content-Disposition", ""))
            files.append((query_path or name, bytes(data)))
        if not files:
            raise ConnectError("invalid_argument", "no `file` part in the upload")
        return files
    if not query_path:
        raise ConnectError("invalid_argument", "an octet-stream upload needs ?path=")
    body = bytearray()
    while chunk := await request.content.readany():
        body += chunk
        if len(body) > limit:
            raise _upload_too_large(limit)
    return [(query_path, bytes(body))]


def _upload_too_large(limit: int) -> ConnectError:
    return ConnectError(
        "resource_exhausted",
        f"the upload is over {limit} bytes, the gateway's bound (--max-upload-bytes); "
        "send larger trees with Sandman's SDK (upload_tar)",
    )


async def health(request: web.Request) -> web.Response:
    """Without ``E2b-Sandbox-Id``: the gateway's own health (204), which
    needs no credential. With it: whether that sandbox's daemon answers (204,
    else 502), only for the sandbox's access token; without it 401 whether
    the sandbox exists or not, and no pod is looked up, no daemon called."""
    gw = request.app[GATEWAY]
    if not request.headers.get(SANDBOX_ID_HEADER, ""):
        return web.Response(status=204)
    try:
        sid = gw.envd_sandbox(request.headers)
    except ConnectError as e:
        return _http_error(e)
    try:
        entry = await gw.entry(sid)
        await entry.sandbox.status()
    except SandmanError:
        return web.Response(status=502)
    return web.Response(status=204)


def routes() -> list[web.RouteDef]:
    def authenticate(request: web.Request) -> str:
        return request.app[GATEWAY].authenticate_envd(request)

    process = connect_routes(
        "process.Process",
        unary={
            "List": list_processes,
            "SendSignal": send_signal,
            "SendInput": send_input,
            "CloseStdin": close_stdin,
        },
        streams={"Start": start, "Connect": connect},
        unimplemented=("Update", "StreamInput"),
        authenticate=authenticate,
    )
    filesystem = connect_routes(
        "filesystem.Filesystem",
        unary={
            "Stat": stat,
            "ListDir": list_dir,
            "MakeDir": make_dir,
            "Move": move,
            "Remove": remove,
        },
        streams={},
        unimplemented=("WatchDir", "CreateWatcher", "GetWatcherEvents", "RemoveWatcher"),
        authenticate=authenticate,
    )
    plain = [web.get("/files", files_get), web.post("/files", files_post),
             web.get("/health", health)]  # fmt: skip
    return process + filesystem + plain
