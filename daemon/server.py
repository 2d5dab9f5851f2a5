"""The daemon's HTTP server: app factory, middlewares, lifecycle, PID 1 duties."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from aiohttp import web

from sandman.daemon import api
from sandman.daemon.background import BackgroundProcesses
from sandman.daemon.children import ChildReaper, become_subreaper, kill_all_children
from sandman.daemon.commands import base_environment
from sandman.daemon.config import DaemonConfig
from sandman.daemon.errors import APIError, Unauthorized
from sandman.daemon.metrics import DaemonMetrics
from sandman.daemon.paths import PathPolicy
from sandman.daemon.reset import Pristine, record
from sandman.daemon.sessions import Sessions
from sandman.daemon.state import STATE, DaemonState, scratch_dir
from sandman.daemon.status import Activity

log = logging.getLogger("sandmand")

OPEN_PATHS = frozenset({"/healthz"})
TOKEN_HEADER = "X-Sandman-Token"
# Looking at a sandbox is not using it: the reaper polls /v1/status to learn
# idleness, and that poll must not reset what it measures.
PASSIVE_PATHS = frozenset({"/v1/status", "/metrics"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as JSON; nothing a client sends crashes the daemon."""
    st = request.app[STATE]
    route = (
        request.match_info.route.resource.canonical if request.match_info.route.resource else "?"
    )
    t0 = time.monotonic()
    code = 500
    try:
        resp = await handler(request)
        code = resp.status
        return resp
    except APIError as e:
        code = e.status
        return _error(e.status, e.code, e.message)
    except web.HTTPException as e:
        code = e.status
        if e.status < 400:
            raise
        return _error(e.status, e.reason.lower().replace(" ", "_"), e.reason)
    except (ConnectionResetError, asyncio.CancelledError):
        code = 499  # the client went away
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error(500, "internal", "internal error (logged by the daemon)")
    finally:
        st.metrics.requests.labels(route, str(code)).inc()
        st.metrics.request_seconds.labels(route).observe(time.monotonic() - t0)


def _token(request: web.Request) -> str:
    # X-Sandman-Token exists for the apiserver's pods/proxy path: the apiserver
    # authenticates the caller with Authorization and strips that header.
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get(TOKEN_HEADER, "").strip()


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in OPEN_PATHS:
        return await handler(request)
    st = request.app[STATE]
    expected = st.config.token_sha256
    if expected is None:
        raise Unauthorized("this daemon has no token configured; nothing is served")
    token = _token(request)
    if not token:
        raise Unauthorized("missing token (Authorization: Bearer <token>, or X-Sandman-Token)")
    got = hashlib.sha256(token.encode()).hexdigest()
    if not hmac.compare_digest(got, expected):
        raise Unauthorized("invalid token")
    if request.path not in PASSIVE_PATHS:
        st.activity.touch()
    return await handler(request)


def default_workspace(config: DaemonConfig) -> Path | None:
    """The workspace reset restores: configured, else the start dir if it is a
    git checkout (the image's WORKDIR, as for SWE-style task images)."""
    if config.workspace is not None:
        return config.workspace
    cwd = Path.cwd()
    return cwd if (cwd / ".git").exists() else None


def create_app(config: DaemonConfig, env: dict[str, str] | None = None) -> web.Application:
    """The API app. Holds no module state: everything lives in its DaemonState."""
    base_env = base_environment(
        env if env is not None else dict(os.environ), str(config.daemon_dir)
    )
    reaper = ChildReaper()
    scratch = Path(scratch_dir(config))
    state = DaemonState(
        config=config,
        base_env=base_env,
        reaper=reaper,
        sessions=Sessions(
            reaper,
            base_env,
            scratch,
            config.limits.max_sessions,
            str(default_workspace(config) or "/"),
        ),
        background=BackgroundProcesses(
            reaper, base_env, config.limits.ring_bytes, config.limits.max_background
        ),
        policy=PathPolicy(config.allowed_roots, (config.daemon_dir,)),
        metrics=DaemonMetrics.create(),
        activity=Activity(),
    )
    # Middlewares run outermost first: errors wrap auth, so a 401 is JSON too.
    app = web.Application(
        middlewares=[errors_middleware, auth_middleware],
        client_max_size=config.limits.max_json_bytes,
    )
    app[STATE] = state
    api.add_routes(app)
    app.cleanup_ctx.append(_lifecycle)
    return app


def remove_stale_extractions(daemon_dir: Path) -> list[str]:
    """Delete what earlier runs' bootloaders unpacked and never removed.

    Both bootloaders clean up after a normal exit, but a SIGKILL leaves ~30 MB
    behind in the emptyDir, which outlives container restarts. Ours are the
    dirs our own executable and runtime live in; everything else of that
    shape is stale.
    """
    ours = {
        os.path.realpath(p)
        for p in (os.path.dirname(sys.executable), getattr(sys, "_MEIPASS", ""))
        if p
    }
    removed = []
    for d in daemon_dir.glob("*"):
        if (
            d.name.startswith(("staticx-", "_MEI"))
            and d.is_dir()
            and (os.path.realpath(d) not in ours)
        ):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d.name)
    return removed


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    st = app[STATE]
    loop = asyncio.get_running_loop()
    if getattr(sys, "frozen", False):
        stale = remove_stale_extractions(st.config.daemon_dir)
        if stale:
            log.info("removed stale extraction dirs %s", stale)
    st.reaper.start(loop)
    Path(scratch_dir(st.config)).mkdir(parents=True, exist_ok=True)
    pristine_file = st.config.daemon_dir / "pristine.json"
    # Recorded once per sandbox: a restarted daemon must keep comparing with
    # the state the sandbox started in, not with what the agent left.
    st.pristine = Pristine.load(pristine_file)
    if st.pristine is None:
        st.pristine = await record(
            st.reaper, st.base_env, default_workspace(st.config), st.config.manifest_files
        )
        try:
            st.pristine.save(pristine_file)
        except OSError as e:
            log.warning("cannot persist the pristine record to %s: %s", pristine_file, e)
    st.start_supervised()
    yield
    st.stopping = True
    await st.sessions.close_all()
    await st.background.close_all()
    await st.stop_supervised()
    st.reaper.stop()


async def terminate_children(reaper: ChildReaper, grace_s: float) -> None:
    """SIGTERM every descendant, SIGKILL what is left after the grace period."""
    if kill_all_children(signal.SIGTERM) == 0:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        reaper.reap()
        if kill_all_children(0) == 0:
            return
        await asyncio.sleep(0.05)
    kill_all_children(signal.SIGKILL)
    await asyncio.sleep(0.05)
    reaper.reap()


# The same as sandman.logs.JsonFormatter, on purpose: the frozen daemon carries
# nothing of the sandman package but itself (daemon/freeze/README.md).
class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


async def _serve(config: DaemonConfig) -> int:
    app = create_app(config)
    st = app[STATE]
    # handler_cancellation: a client that disconnects cancels its handler, which
    # is what stops (and kills) a command nobody will read the result of.
    runner = web.AppRunner(app, handle_signals=False, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True, backlog=1024)
    await site.start()
    log.info("serving on %s (version %s, pid %d)", config.listen, st.version, os.getpid())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping: SIGTERM to children, %.1fs grace", config.grace_s)
    st.stopping = True
    await terminate_children(st.reaper, config.grace_s)
    exit_code = st.supervised_exit or 0
    await runner.cleanup()
    return exit_code if exit_code >= 0 else 128 - exit_code


def serve(config: DaemonConfig) -> int:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    if os.getpid() != 1 and not become_subreaper():
        log.warning("could not become child subreaper; orphans may linger as zombies")
    return asyncio.run(_serve(config))
