"""HTTP handlers of API v1 (thin: parse, call the mechanism, render)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sandman.daemon import files, tarstream
from sandman.daemon.commands import run_command
from sandman.daemon.errors import BadRequest, PayloadTooLarge, Unavailable
from sandman.daemon.output import decode, encode
from sandman.daemon.requests import (
    exec_request,
    optional_fields,
    run_request,
    session_request,
    signal_request,
    start_request,
)
from sandman.daemon.reset import reset
from sandman.daemon.sessions import result_json
from sandman.daemon.state import STATE, DaemonState
from sandman.daemon.status import processes, resources

FILE_CHUNK = 256 << 10


def _state(request: web.Request) -> DaemonState:
    return request.app[STATE]


async def read_json(request: web.Request, *, optional: bool = False) -> Any:
    limit = _state(request).config.limits.max_json_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"JSON body over {limit} bytes; use the file API for big data")
    # content.read(n) returns what has arrived so far, not n bytes: collect
    # chunks until EOF (a body split across TCP segments is the normal case).
    parts, size = [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"JSON body over {limit} bytes; use the file API for big data")
        parts.append(chunk)
    data = b"".join(parts)
    if not data.strip():
        if optional:
            return None
        raise BadRequest("a JSON body is required")
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"invalid JSON: {e}", code="invalid_json") from None


def _q_bool(request: web.Request, name: str) -> bool:
    v = request.query.get(name, "").lower()
    if v in ("", "0", "false", "no"):
        return False
    if v in ("1", "true", "yes"):
        return True
    raise BadRequest(f"query parameter {name} must be true or false")


def _q_int(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name} must be an integer") from None
    if not lo <= v <= hi:
        raise BadRequest(f"query parameter {name} must be between {lo} and {hi}")
    return v


def _q_float(request: web.Request, name: str, default: float, lo: float, hi: float) -> float:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name} must be a number") from None
    if not lo <= v <= hi:
        raise BadRequest(f"query parameter {name} must be between {lo:g} and {hi:g}")
    return v


# -- health, metrics, status ----------------------------------------------------
async def healthz(request: web.Request) -> web.Response:
    st = _state(request)
    if st.stopping:
        return web.json_response({"ok": False, "stopping": True}, status=503)
    return web.json_response({"ok": True})


async def metrics(request: web.Request) -> web.Response:
    st = _state(request)
    st.metrics.orphans_reaped.set(st.reaper.orphans_reaped)
    st.metrics.background.set(len(st.background.list()))
    st.metrics.sessions.set(len(st.sessions.list()))
    body = generate_latest(st.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def status(request: web.Request) -> web.Response:
    st = _state(request)
    doc = {
        "version": st.version,
        "started_at": st.activity.started,
        "uptime_s": st.activity.clock() - st.activity.started,
        "last_activity_at": st.activity.last,
        "idle_s": st.activity.clock() - st.activity.last,
        "api_calls": st.activity.calls,
        "workspace": st.pristine.workspace if st.pristine else None,
        "pristine_commit": st.pristine.commit if st.pristine else None,
        "command": st.supervised_info(),
        "sessions": len(st.sessions.list()),
        "background": [p.info() for p in st.background.list() if p.running],
        "processes": await asyncio.get_running_loop().run_in_executor(None, processes),
        "resources": resources(),
        "orphans_reaped": st.reaper.orphans_reaped,
    }
    return web.json_response(doc)


# -- exec -------------------------------------------------------------------------
async def exec_(request: web.Request) -> web.StreamResponse:
    st = _state(request)
    req = exec_request(await read_json(request), st.config.limits)
    if not _q_bool(request, "stream"):
        result = await run_command(st.reaper, req, st.base_env)
        st.count_command(result)
        return web.json_response(result.to_json())
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()

    async def forward() -> None:
        while (item := await queue.get()) is not None:
            text, enc = encode(item[1])
            line = {"type": "output", "stream": item[0], "data": text, "encoding": enc}
            await resp.write(json.dumps(line).encode() + b"\n")

    writer = asyncio.ensure_future(forward())
    running = asyncio.ensure_future(
        run_command(st.reaper, req, st.base_env, on_chunk=lambda s, d: queue.put_nowait((s, d)))
    )
    # A failed write means the client is gone: stop the command with it.
    writer.add_done_callback(lambda w: running.cancel() if w.exception() else None)
    try:
        result = await running
    finally:
        queue.put_nowait(None)
    await writer
    st.count_command(result)
    final = result.to_json()
    final.pop("stdout")
    final.pop("stderr")
    final.pop("stdout_encoding")
    final.pop("stderr_encoding")
    await resp.write(json.dumps({"type": "result", **final}).encode() + b"\n")
    await resp.write_eof()
    return resp


# -- sessions ---------------------------------------------------------------------
async def session_create(request: web.Request) -> web.Response:
    st = _state(request)
    session = await st.sessions.create(session_request(await read_json(request, optional=True)))
    return web.json_response(session.info(), status=201)


async def session_list(request: web.Request) -> web.Response:
    return web.json_response({"sessions": [s.info() for s in _state(request).sessions.list()]})


async def session_get(request: web.Request) -> web.Response:
    return web.json_response(_state(request).sessions.get(request.match_info["id"]).info())


async def session_delete(request: web.Request) -> web.Response:
    await _state(request).sessions.delete(request.match_info["id"])
    return web.json_response({"deleted": request.match_info["id"]})


async def session_run(request: web.Request) -> web.Response:
    st = _state(request)
    session = st.sessions.get(request.match_info["id"])
    req = run_request(await read_json(request), st.config.limits)
    result, alive = await session.run(st.reaper, req)
    st.count_command(result)
    return web.json_response(result_json(result, session, alive))


# -- background processes ---------------------------------------------------------
async def proc_start(request: web.Request) -> web.Response:
    st = _state(request)
    proc = st.background.start(start_request(await read_json(request)))
    return web.json_response(proc.info(), status=201)


async def proc_list(request: web.Request) -> web.Response:
    return web.json_response({"processes": [p.info() for p in _state(request).background.list()]})


async def proc_get(request: web.Request) -> web.Response:
    return web.json_response(_state(request).background.get(request.match_info["id"]).info())


async def proc_delete(request: web.Request) -> web.Response:
    await _state(request).background.delete(request.match_info["id"])
    return web.json_response({"deleted": request.match_info["id"]})


async def proc_output(request: web.Request) -> web.Response:
    st = _state(request)
    proc = st.background.get(request.match_info["id"])
    stream = request.query.get("stream", "combined")
    if stream not in proc.rings:
        raise BadRequest("stream must be stdout, stderr or combined")
    offset = _q_int(request, "offset", 0, 0, 1 << 62)
    limit = _q_int(request, "limit", 1 << 20, 0, st.config.limits.max_output_bytes)
    wait_s = _q_float(request, "wait_s", 0.0, 0.0, 60.0)
    if wait_s and proc.running:
        await proc.rings[stream].wait_beyond(offset, wait_s)
    return web.json_response(proc.output(stream, offset, limit))


async def proc_stdin(request: web.Request) -> web.Response:
    st = _state(request)
    proc = st.background.get(request.match_info["id"])
    body = optional_fields(await read_json(request), {"data", "encoding", "eof"}, "stdin")
    data = body.get("data", "")
    enc = body.get("encoding", "utf-8")
    eof = body.get("eof", False)
    if not isinstance(data, str) or enc not in ("utf-8", "base64") or not isinstance(eof, bool):
        raise BadRequest("stdin wants {data: string, encoding: utf-8|base64, eof: bool}")
    try:
        raw = decode(data, enc)
    except ValueError as e:
        raise BadRequest(f"data is not valid {enc}: {e}") from None
    await proc.write_stdin(raw, eof)
    return web.json_response({"written": len(raw), "eof": eof})


async def proc_signal(request: web.Request) -> web.Response:
    st = _state(request)
    proc = st.background.get(request.match_info["id"])
    sig = signal_request(await read_json(request, optional=True) or {})
    proc.signal(sig)
    return web.json_response({"signalled": sig})


async def proc_wait(request: web.Request) -> web.Response:
    st = _state(request)
    proc = st.background.get(request.match_info["id"])
    body = optional_fields(await read_json(request, optional=True), {"timeout_s"}, "wait")
    timeout = body.get("timeout_s", 30)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not (0 <= timeout <= 3600)
    ):
        raise BadRequest("timeout_s must be a number between 0 and 3600")
    await proc.wait(float(timeout))
    return web.json_response(proc.info())


# -- files ------------------------------------------------------------------------
async def file_read(request: web.Request) -> web.StreamResponse:
    st = _state(request)
    path, fd, size = files.open_for_read(st.policy, request.query.get("path"))
    resp = web.StreamResponse(
        headers={
            "Content-Type": "application/octet-stream",
            "Content-Length": str(size),
            "X-Sandman-Path": str(path),
        }
    )
    try:
        await resp.prepare(request)
        while chunk := os.read(fd, FILE_CHUNK):
            await resp.write(chunk)
    finally:
        os.close(fd)
    await resp.write_eof()
    return resp


async def file_write(request: web.Request) -> web.Response:
    st = _state(request)
    mode = files.parse_mode(request.query.get("mode"), 0o644)
    path, tmp, fd = files.open_for_write(
        st.policy,
        request.query.get("path"),
        mode=mode,
        mkdirs=_q_bool(request, "mkdirs"),
        append=_q_bool(request, "append"),
    )
    limit = st.config.limits.max_upload_bytes
    total, ok = 0, False
    try:
        async for chunk in request.content.iter_chunked(FILE_CHUNK):
            total += len(chunk)
            if total > limit:
                raise PayloadTooLarge(f"upload over {limit} bytes")
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        ok = True
    finally:
        files.finish_write(path, tmp, fd, ok)
    return web.json_response({"path": str(path), "bytes": total}, status=201)


async def file_delete(request: web.Request) -> web.Response:
    st = _state(request)
    return web.json_response(
        files.remove(st.policy, request.query.get("path"), _q_bool(request, "recursive"))
    )


async def file_stat(request: web.Request) -> web.Response:
    st = _state(request)
    return web.json_response(
        files.stat_path(st.policy, request.query.get("path"), _q_bool(request, "follow"))
    )


async def file_list(request: web.Request) -> web.Response:
    return web.json_response(files.list_dir(_state(request).policy, request.query.get("path")))


async def file_mkdir(request: web.Request) -> web.Response:
    st = _state(request)
    body = optional_fields(await read_json(request), {"path", "parents", "mode"}, "mkdir")
    parents = body.get("parents", True)
    if not isinstance(parents, bool):
        raise BadRequest("parents must be a boolean")
    mode = files.parse_mode(body.get("mode"), 0o755)
    return web.json_response(files.make_dir(st.policy, body.get("path"), parents, mode), status=201)


async def file_move(request: web.Request) -> web.Response:
    st = _state(request)
    body = optional_fields(await read_json(request), {"src", "dst", "overwrite"}, "move")
    overwrite = body.get("overwrite", False)
    if not isinstance(overwrite, bool):
        raise BadRequest("overwrite must be a boolean")
    return web.json_response(files.move(st.policy, body.get("src"), body.get("dst"), overwrite))


async def file_remove(request: web.Request) -> web.Response:
    st = _state(request)
    body = optional_fields(await read_json(request), {"path", "recursive"}, "remove")
    recursive = body.get("recursive", False)
    if not isinstance(recursive, bool):
        raise BadRequest("recursive must be a boolean")
    return web.json_response(files.remove(st.policy, body.get("path"), recursive))


async def tar_upload(request: web.Request) -> web.Response:
    st = _state(request)
    raw = request.query.get("path")
    if _q_bool(request, "mkdirs"):
        files.make_dir(st.policy, raw, True, 0o755)
    stats = await tarstream.extract(
        st.policy, raw, request.content.iter_chunked(FILE_CHUNK), st.config.limits.max_upload_bytes
    )
    return web.json_response(
        {
            "path": raw,
            "files": stats.files,
            "dirs": stats.dirs,
            "links": stats.links,
            "bytes": stats.bytes,
        },
        status=201,
    )


async def tar_download(request: web.Request) -> web.StreamResponse:
    st = _state(request)
    gz = _q_bool(request, "gzip")
    chunks = tarstream.archive(st.policy, request.query.get("path"), gz)
    first = await anext(chunks, b"")  # errors (404, 403) surface before the 200
    resp = web.StreamResponse(
        headers={"Content-Type": "application/gzip" if gz else "application/x-tar"}
    )
    await resp.prepare(request)
    try:
        await resp.write(first)
        async for chunk in chunks:
            await resp.write(chunk)
    finally:
        await chunks.aclose()
    await resp.write_eof()
    return resp


# -- reset ------------------------------------------------------------------------
async def reset_(request: web.Request) -> web.Response:
    st = _state(request)
    optional_fields(await read_json(request, optional=True), set(), "reset")
    if st.pristine is None:
        raise Unavailable("the daemon is still recording the pristine state; retry")
    # Shielded: a client that disconnects mid-reset must not leave the sandbox
    # half restored; the next reset (or the client's retry) sees the result.
    report = await asyncio.shield(_reset_locked(st))
    return web.json_response(report.to_json())


async def _reset_locked(st: DaemonState) -> Any:
    async with st.reset_lock:
        await st.sessions.close_all()
        await st.background.close_all()
        report = await reset(
            st.reaper, st.base_env, st.pristine, st.config.temp_dirs, (st.config.daemon_dir,)
        )
        await st.restart_supervised()
        return report


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/healthz", healthz)
    r.add_get("/metrics", metrics)
    r.add_get("/v1/status", status)
    r.add_post("/v1/exec", exec_)
    r.add_post("/v1/sessions", session_create)
    r.add_get("/v1/sessions", session_list)
    r.add_get("/v1/sessions/{id}", session_get)
    r.add_delete("/v1/sessions/{id}", session_delete)
    r.add_post("/v1/sessions/{id}/run", session_run)
    r.add_post("/v1/processes", proc_start)
    r.add_get("/v1/processes", proc_list)
    r.add_get("/v1/processes/{id}", proc_get)
    r.add_delete("/v1/processes/{id}", proc_delete)
    r.add_get("/v1/processes/{id}/output", proc_output)
    r.add_post("/v1/processes/{id}/stdin", proc_stdin)
    r.add_post("/v1/processes/{id}/signal", proc_signal)
    r.add_post("/v1/processes/{id}/wait", proc_wait)
    r.add_get("/v1/files", file_read)
    r.add_put("/v1/files", file_write)
    r.add_delete("/v1/files", file_delete)
    r.add_get("/v1/files/stat", file_stat)
    r.add_get("/v1/files/list", file_list)
    r.add_post("/v1/files/mkdir", file_mkdir)
    r.add_post("/v1/files/move", file_move)
    r.add_post("/v1/files/remove", file_remove)
    r.add_get("/v1/files/tar", tar_download)
    r.add_put("/v1/files/tar", tar_upload)
    r.add_post("/v1/reset", reset_)
