"""HTTP handlers of API v1 (thin: parse, call the mechanism, render).

Handlers never block the event loop: file-system calls that can take long
(opening what may be a FIFO, removing a big tree, listing a huge directory)
run in the daemon's bounded thread pool (``blocking``), so one request never
freezes /healthz and makes the pod NotReady.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sandman.daemon import files
from sandman.daemon.commands import run_command
from sandman.daemon.errors import BadRequest, Conflict, PayloadTooLarge, Unavailable
from sandman.daemon.http import (
    Request,
    Response,
    Router,
    StreamResponse,
    Upgraded,
    json_response,
)
from sandman.daemon.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from sandman.daemon.output import decode, encode
from sandman.daemon.requests import (
    exec_request,
    optional_fields,
    run_request,
    session_request,
    signal_request,
    start_request,
)
from sandman.daemon.sessions import result_json
from sandman.daemon.state import DaemonState

FILE_CHUNK = 256 << 10
T = TypeVar("T")


def _state(request: Request) -> DaemonState:
    return request.ctx  # type: ignore[no-any-return]


async def blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run a call that may block (file system) in the daemon's thread pool."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def read_json(request: Request, *, optional: bool = False) -> Any:
    limit = _state(request).config.limits.max_json_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"JSON body over {limit} bytes; use the file API for big data")
    try:
        data = await request.body.read(limit)
    except PayloadTooLarge:
        raise PayloadTooLarge(
            f"JSON body over {limit} bytes; use the file API for big data"
        ) from None
    if not data.strip():
        if optional:
            return None
        raise BadRequest("a JSON body is required")
    try:
        # UTF-8 only (RFC 8259): json.loads would also guess UTF-16 and -32.
        # Duplicated keys are refused: which one counts differs between
        # parsers, so a checked body could run as another.
        return json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"invalid JSON: {e}", code="invalid_json") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _q_bool(request: Request, name: str) -> bool:
    v = request.query.get(name, "").lower()
    if v in ("", "0", "false", "no"):
        return False
    if v in ("1", "true", "yes"):
        return True
    raise BadRequest(f"query parameter {name} must be true or false")


def _q_int(request: Request, name: str, default: int, lo: int, hi: int) -> int:
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


def _q_float(request: Request, name: str, default: float, lo: float, hi: float) -> float:
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


# -- health, readiness, idle, metrics, status ------------------------------------
async def healthz(request: Request) -> Response:
    st = _state(request)
    if st.stopping:
        return json_response({"ok": False, "stopping": True}, status=503)
    return json_response({"ok": True})


async def readyz(request: Request) -> Response:
    """Ready: the daemon serves AND (if given) the container's own probe passes."""
    st = _state(request)
    if st.stopping or not st.started:
        return json_response({"ready": False, "reason": "daemon not serving"}, status=503)
    probe = st.config.readiness_probe
    if probe is None:
        return json_response({"ready": True})
    from sandman.daemon.readiness import check

    async def run_exec(argv: tuple[str, ...], timeout_s: float) -> int:
        from sandman.daemon.requests import ExecRequest

        req = ExecRequest(argv, None, {}, None, timeout_s, 4096)
        return (await run_command(st.reaper, req, st.base_env)).exit_code

    ok, why = await st.readiness.outcome(probe.period_s, lambda: check(probe, run_exec))
    return json_response({"ready": ok, "reason": why}, status=200 if ok else 503)


async def idle(request: Request) -> Response:
    """The reaper's figure: whole seconds without use, and nothing else."""
    st = _state(request)
    if st.stopping:
        return json_response({"error": {"code": "unavailable", "message": "stopping"}}, 503)
    return json_response({"idle_s": int(st.activity.idle_s(st.background.keeping_active))})


async def metrics(request: Request) -> Response:
    st = _state(request)
    st.metrics.orphans_reaped.mirror(st.reaper.orphans_reaped)
    st.metrics.background.set(len(st.background.list()))
    st.metrics.sessions.set(len(st.sessions.list()))
    return Response(st.metrics.render(), content_type=METRICS_CONTENT_TYPE)


async def status(request: Request) -> Response:
    from sandman.daemon.status import processes, resources

    st = _state(request)
    busy = st.background.keeping_active
    doc = {
        "version": st.version,
        "started_at": st.activity.started,
        "uptime_s": st.activity.clock() - st.activity.started,
        "last_activity_at": st.activity.last,
        "idle_s": st.activity.idle_s(busy),
        "requests_in_flight": st.activity.in_flight,
        "background_keeps_active": busy,
        "api_calls": st.activity.calls,
        "workspace": st.pristine.workspace if st.pristine else None,
        "pristine_commit": st.pristine.commit if st.pristine else None,
        "pristine": st.pristine.info() if st.pristine else None,
        "command": st.supervised_info(),
        "sessions": len(st.sessions.list()),
        "background": [p.info() for p in st.background.list() if p.running],
        "processes": await blocking(processes),
        "resources": await blocking(resources),
        "orphans_reaped": st.reaper.orphans_reaped,
    }
    return json_response(doc)


# -- exec -------------------------------------------------------------------------
async def exec_(request: Request) -> Response | StreamResponse:
    st = _state(request)
    req = exec_request(await read_json(request), st.config.limits)
    if not _q_bool(request, "stream"):
        result = await run_command(st.reaper, req, st.base_env)
        st.count_command(result)
        return json_response(result.to_json())
    resp = StreamResponse(headers={"Content-Type": "application/x-ndjson"})

    async def started() -> None:
        # The 200 goes out only once the command runs: one that cannot start
        # is answered 400 as without ?stream=1 (a stream cut after its 200
        # reached clients as a broken answer, through a proxy as a reset).
        await resp.prepare(request)

    async def forward(stream: str, data: bytes) -> None:
        # Returns when the client has taken it (transport drained): the pipe
        # is read no faster, so a slow reader of `yes` costs no memory.
        text, enc = encode(data)
        line = {"type": "output", "stream": stream, "data": text, "encoding": enc}
        await resp.write(json.dumps(line).encode() + b"\n")

    result = await run_command(st.reaper, req, st.base_env, on_chunk=forward, on_started=started)
    st.count_command(result)
    final = result.to_json()
    for k in ("stdout", "stderr", "stdout_encoding", "stderr_encoding"):
        final.pop(k)
    await resp.write(json.dumps({"type": "result", **final}).encode() + b"\n")
    await resp.write_eof()
    return resp


# -- interactive terminal -----------------------------------------------------------
async def pty(request: Request) -> Upgraded:
    """A program on a pseudo-terminal over a WebSocket (protocol: terminal.py)."""
    from sandman.daemon import terminal
    from sandman.daemon.websocket import WebSocket, WebSocketClosed, check_handshake

    st = _state(request)
    key = check_handshake(request)  # errors before the upgrade are plain HTTP
    terminal.check_capacity(st)
    ws = WebSocket(request)
    await ws.accept(key)
    with contextlib.suppress(WebSocketClosed):
        await terminal.run(ws, st)
    return Upgraded()


# -- sessions ---------------------------------------------------------------------
async def session_create(request: Request) -> Response:
    st = _state(request)
    session = await st.sessions.create(session_request(await read_json(request, optional=True)))
    return json_response(session.info(), status=201)


async def session_list(request: Request) -> Response:
    return json_response({"sessions": [s.info() for s in _state(request).sessions.list()]})


async def session_get(request: Request) -> Response:
    return json_response(_state(request).sessions.get(request.match["id"]).info())


async def session_delete(request: Request) -> Response:
    await _state(request).sessions.delete(request.match["id"])
    return json_response({"deleted": request.match["id"]})


async def session_run(request: Request) -> Response:
    st = _state(request)
    session = st.sessions.get(request.match["id"])
    req = run_request(await read_json(request), st.config.limits)
    result, alive = await session.run(st.reaper, req)
    st.count_command(result)
    return json_response(result_json(result, session, alive))


# -- background processes ---------------------------------------------------------
async def proc_start(request: Request) -> Response:
    st = _state(request)
    proc = st.background.start(start_request(await read_json(request)))
    return json_response(proc.info(), status=201)


async def proc_list(request: Request) -> Response:
    return json_response({"processes": [p.info() for p in _state(request).background.list()]})


async def proc_get(request: Request) -> Response:
    return json_response(_state(request).background.get(request.match["id"]).info())


async def proc_delete(request: Request) -> Response:
    await _state(request).background.delete(request.match["id"])
    return json_response({"deleted": request.match["id"]})


async def proc_output(request: Request) -> Response:
    st = _state(request)
    proc = st.background.get(request.match["id"])
    stream = request.query.get("stream", "combined")
    if stream not in proc.rings:
        raise BadRequest("stream must be stdout, stderr or combined")
    offset = _q_int(request, "offset", 0, 0, 1 << 62)
    limit = _q_int(request, "limit", 1 << 20, 0, st.config.limits.max_output_bytes)
    wait_s = _q_float(request, "wait_s", 0.0, 0.0, 60.0)
    if wait_s and proc.running:
        await proc.rings[stream].wait_beyond(offset, wait_s)
    return json_response(proc.output(stream, offset, limit))


async def proc_stdin(request: Request) -> Response:
    st = _state(request)
    proc = st.background.get(request.match["id"])
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
    return json_response({"written": len(raw), "eof": eof})


async def proc_signal(request: Request) -> Response:
    st = _state(request)
    proc = st.background.get(request.match["id"])
    sig = signal_request(await read_json(request, optional=True) or {})
    proc.signal(sig)
    return json_response({"signalled": sig})


async def proc_wait(request: Request) -> Response:
    st = _state(request)
    proc = st.background.get(request.match["id"])
    body = optional_fields(await read_json(request, optional=True), {"timeout_s"}, "wait")
    timeout = body.get("timeout_s", 30)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not (0 <= timeout <= 3600)
    ):
        raise BadRequest("timeout_s must be a number between 0 and 3600")
    await proc.wait(float(timeout))
    return json_response(proc.info())


# -- files ------------------------------------------------------------------------
async def file_read(request: Request) -> StreamResponse:
    st = _state(request)
    path, fd, size = await blocking(files.open_for_read, st.policy, request.query.get("path"))
    try:
        resp = StreamResponse(
            headers={
                "Content-Type": "application/octet-stream",
                "Content-Length": str(size),
                "X-Sandman-Path": str(path),
            }
        )
        await resp.prepare(request)
        sent = 0
        while sent < size and (chunk := await blocking(os.read, fd, FILE_CHUNK)):
            chunk = chunk[: size - sent]  # the file grew: we promised `size` bytes
            sent += len(chunk)
            await resp.write(chunk)
        if sent < size:
            # The file shrank while we sent it: the client must not take a
            # short body for the whole file, so the connection is cut.
            raise ConnectionResetError(f"{path} shrank while being read")
    finally:
        os.close(fd)
    await resp.write_eof()
    return resp


async def file_write(request: Request) -> Response:
    st = _state(request)
    mode = files.parse_mode(request.query.get("mode"), 0o644)
    mkdirs, append = _q_bool(request, "mkdirs"), _q_bool(request, "append")
    path, tmp, fd = await blocking(
        lambda: files.open_for_write(
            st.policy, request.query.get("path"), mode=mode, mkdirs=mkdirs, append=append
        )
    )
    limit = st.config.limits.max_upload_bytes
    total, ok = 0, False
    try:
        async for chunk in request.body.chunks(limit):
            total += len(chunk)
            await blocking(files.write_all, fd, chunk)
        ok = True
    finally:
        await blocking(files.finish_write, path, tmp, fd, ok)
    return json_response({"path": str(path), "bytes": total}, status=201)


async def file_delete(request: Request) -> Response:
    st = _state(request)
    return json_response(
        await blocking(
            files.remove, st.policy, request.query.get("path"), _q_bool(request, "recursive")
        )
    )


async def file_stat(request: Request) -> Response:
    st = _state(request)
    return json_response(
        await blocking(
            files.stat_path, st.policy, request.query.get("path"), _q_bool(request, "follow")
        )
    )


async def file_list(request: Request) -> Response:
    st = _state(request)
    return json_response(await blocking(files.list_dir, st.policy, request.query.get("path")))


async def file_mkdir(request: Request) -> Response:
    st = _state(request)
    body = optional_fields(await read_json(request), {"path", "parents", "mode"}, "mkdir")
    parents = body.get("parents", True)
    if not isinstance(parents, bool):
        raise BadRequest("parents must be a boolean")
    mode = files.parse_mode(body.get("mode"), 0o755)
    doc = await blocking(files.make_dir, st.policy, body.get("path"), parents, mode)
    return json_response(doc, status=201)


async def file_move(request: Request) -> Response:
    st = _state(request)
    body = optional_fields(await read_json(request), {"src", "dst", "overwrite"}, "move")
    overwrite = body.get("overwrite", False)
    if not isinstance(overwrite, bool):
        raise BadRequest("overwrite must be a boolean")
    return json_response(
        await blocking(files.move, st.policy, body.get("src"), body.get("dst"), overwrite)
    )


async def file_remove(request: Request) -> Response:
    st = _state(request)
    body = optional_fields(await read_json(request), {"path", "recursive"}, "remove")
    recursive = body.get("recursive", False)
    if not isinstance(recursive, bool):
        raise BadRequest("recursive must be a boolean")
    return json_response(await blocking(files.remove, st.policy, body.get("path"), recursive))


async def tar_upload(request: Request) -> Response:
    from sandman.daemon import tarstream  # tarfile is imported only when a tar moves

    st = _state(request)
    raw = request.query.get("path")
    if _q_bool(request, "mkdirs"):
        await blocking(files.make_dir, st.policy, raw, True, 0o755)
    limit = st.config.limits.max_upload_bytes
    stats = await tarstream.extract(st.policy, raw, request.body.chunks(limit), limit)
    return json_response(
        {
            "path": raw,
            "files": stats.files,
            "dirs": stats.dirs,
            "links": stats.links,
            "bytes": stats.bytes,
        },
        status=201,
    )


async def tar_download(request: Request) -> StreamResponse:
    from sandman.daemon import tarstream

    st = _state(request)
    gz = _q_bool(request, "gzip")
    chunks = tarstream.archive(st.policy, request.query.get("path"), gz)
    first = await anext(chunks, b"")  # errors (404, 403) surface before the 200
    resp = StreamResponse(
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
async def reset_(request: Request) -> Response:
    st = _state(request)
    optional_fields(await read_json(request, optional=True), set(), "reset")
    if st.config.no_reset:
        raise Conflict(
            "this sandbox refuses /v1/reset (the eval profile: one fresh sandbox per task, "
            "never reused); replace it instead",
            code="reset_disabled",
        )
    if not st.started:
        raise Unavailable("the daemon is still recording the pristine state; retry")
    # Shielded: a client that disconnects mid-reset must not leave the sandbox
    # half restored; the next reset (or the client's retry) sees the result.
    report = await asyncio.shield(_reset_locked(st))
    return json_response(report.to_json())


async def _reset_locked(st: DaemonState) -> Any:
    from sandman.daemon.reset import reset

    async with st.reset_lock:
        await st.sessions.close_all()
        await st.background.close_all()
        report = await reset(st)
        await st.restart_supervised()
        return report


ROUTES: Mapping[tuple[str, str], Callable[[Request], Any]] = {
    ("GET", "/healthz"): healthz,
    ("GET", "/readyz"): readyz,
    ("GET", "/v1/idle"): idle,
    ("GET", "/metrics"): metrics,
    ("GET", "/v1/status"): status,
    ("POST", "/v1/exec"): exec_,
    ("GET", "/v1/pty"): pty,
    ("POST", "/v1/sessions"): session_create,
    ("GET", "/v1/sessions"): session_list,
    ("GET", "/v1/sessions/{id}"): session_get,
    ("DELETE", "/v1/sessions/{id}"): session_delete,
    ("POST", "/v1/sessions/{id}/run"): session_run,
    ("POST", "/v1/processes"): proc_start,
    ("GET", "/v1/processes"): proc_list,
    ("GET", "/v1/processes/{id}"): proc_get,
    ("DELETE", "/v1/processes/{id}"): proc_delete,
    ("GET", "/v1/processes/{id}/output"): proc_output,
    ("POST", "/v1/processes/{id}/stdin"): proc_stdin,
    ("POST", "/v1/processes/{id}/signal"): proc_signal,
    ("POST", "/v1/processes/{id}/wait"): proc_wait,
    ("GET", "/v1/files"): file_read,
    ("PUT", "/v1/files"): file_write,
    ("DELETE", "/v1/files"): file_delete,
    ("GET", "/v1/files/stat"): file_stat,
    ("GET", "/v1/files/list"): file_list,
    ("POST", "/v1/files/mkdir"): file_mkdir,
    ("POST", "/v1/files/move"): file_move,
    ("POST", "/v1/files/remove"): file_remove,
    ("GET", "/v1/files/tar"): tar_download,
    ("PUT", "/v1/files/tar"): tar_upload,
    ("POST", "/v1/reset"): reset_,
}


def add_routes(router: Router) -> None:
    for (method, path), handler in ROUTES.items():
        router.add(method, path, handler)
