"""The daemon's app: routing, auth, activity, metrics, lifecycle, PID 1 duties.

The HTTP protocol itself is ``http.py``; the handlers are ``api.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from sandman.daemon import __version__, api
from sandman.daemon.background import BackgroundProcesses
from sandman.daemon.children import ChildReaper, become_subreaper, kill_all_children
from sandman.daemon.commands import base_environment
from sandman.daemon.config import DaemonConfig
from sandman.daemon.errors import APIError, MethodNotAllowed, NotFound, Unauthorized
from sandman.daemon.http import (
    ConnectionClosed,
    HTTPServer,
    Request,
    Response,
    Router,
    StreamResponse,
    Upgraded,
    error_response,
)
from sandman.daemon.metrics import DaemonMetrics
from sandman.daemon.paths import PathPolicy
from sandman.daemon.sessions import Sessions
from sandman.daemon.state import DaemonState, scratch_dir
from sandman.daemon.status import Activity

log = logging.getLogger("sandmand")

# Answered without a token: probes and the reaper's idle figure reveal
# nothing but "alive", "ready" and a number of seconds; /metrics only counts
# and durations by route pattern, status code and result, and the build
# (metrics.py), for Prometheus, which cannot hold a token per sandbox. Who can
# reach the port at all is the namespace's NetworkPolicy's business.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/v1/idle", "/metrics"})
TOKEN_HEADER = "X-Sandman-Token"
# Looking at a sandbox is not using it: status and metrics polls must not
# reset (or hold at zero) the idle time they report.
PASSIVE_PATHS = frozenset({"/v1/status", "/metrics"})


def _token(request: Request) -> str:
    # X-Sandman-Token exists for the apiserver's pods/proxy path: the apiserver
    # authenticates the caller with Authorization and strips that header.
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get(TOKEN_HEADER.lower(), "").strip()


def default_workspace(config: DaemonConfig) -> Path | None:
    """The workspace reset restores: configured, else the start dir if it is a
    git checkout (the image's WORKDIR, as for SWE-style task images)."""
    if config.workspace is not None:
        return config.workspace
    cwd = Path.cwd()
    return cwd if (cwd / ".git").exists() else None


class App:
    """The API: one per daemon; holds no module state (everything is in ``state``).

    ``dispatch`` is the one place where errors become JSON, auth is checked,
    activity is counted and metrics are recorded.
    """

    def __init__(
        self, config: DaemonConfig, env: dict[str, str] | None = None, *, guard_memory: bool = False
    ) -> None:
        self.guard_memory = guard_memory  # the serving process only, not in-process tests
        base_env = base_environment(
            env if env is not None else dict(os.environ), str(config.daemon_dir)
        )
        reaper = ChildReaper()
        activity = Activity()
        self.state = DaemonState(
            config=config,
            base_env=base_env,
            reaper=reaper,
            sessions=Sessions(
                reaper,
                base_env,
                Path(scratch_dir(config)),
                config.limits.max_sessions,
                str(default_workspace(config) or "/"),
            ),
            background=BackgroundProcesses(
                reaper,
                base_env,
                config.limits.ring_bytes,
                config.limits.max_background,
                on_exit=activity.mark,
            ),
            policy=PathPolicy(config.allowed_roots, (config.daemon_dir,)),
            metrics=DaemonMetrics.create(__version__),
            activity=activity,
        )
        self.router = Router()
        api.add_routes(self.router)

    async def dispatch(self, request: Request) -> Response | StreamResponse | Upgraded:
        st = self.state
        route, methods, match = self.router.resolve(request.method, request.path)
        t0 = time.monotonic()
        code = 500
        counted = False
        try:
            if route is None:
                raise NotFound(f"no such endpoint: {request.path}")
            handler = methods.get(request.method)
            if handler is None:
                allowed = ", ".join(sorted(methods))
                raise MethodNotAllowed(
                    f"{request.method} not allowed on {route}; allowed: {allowed}"
                )
            request.match = match
            request.ctx = st
            if route not in OPEN_PATHS:
                self._authenticate(request)
                if route not in PASSIVE_PATHS:
                    st.activity.begin()
                    counted = True
                    st.metrics.in_flight.set(st.activity.in_flight)
            resp = await handler(request)
            code = 101 if isinstance(resp, Upgraded) else resp.status
            return resp
        except APIError as e:
            code = e.status
            if request.started:
                raise ConnectionClosed() from None  # mid-stream: all we can do is close
            return error_response(e.status, e.code, e.message)
        except (ConnectionClosed, asyncio.CancelledError):
            code = 499  # the client went away
            raise
        except Exception:
            log.exception("unhandled error in %s %s", request.method, request.path)
            if request.started:
                raise ConnectionClosed() from None
            return error_response(500, "internal", "internal error (logged by the daemon)")
        finally:
            if counted:
                st.activity.end()
                st.metrics.in_flight.set(st.activity.in_flight)
            label = route or "?"
            st.metrics.requests.inc(label, str(code))
            st.metrics.request_seconds.observe(time.monotonic() - t0, label)

    def _authenticate(self, request: Request) -> None:
        expected = self.state.config.token_sha256
        if expected is None:
            raise Unauthorized("this daemon has no token configured; nothing is served")
        token = _token(request)
        if not token:
            raise Unauthorized("missing token (Authorization: Bearer <token>, or X-Sandman-Token)")
        got = hashlib.sha256(token.encode()).hexdigest()
        if not hmac.compare_digest(got, expected):
            raise Unauthorized("invalid token")

    # -- lifecycle -------------------------------------------------------------
    async def startup(self) -> None:
        """Everything before the first request: MUST finish before listening, or
        an early exec could change the workspace before its pristine record."""
        st = self.state
        # Before any thread exists: the kernel clears the dumpable flag of the
        # whole process (selfguard.py), keeping its memory from its children.
        if self.guard_memory:
            from sandman.daemon.selfguard import make_undumpable

            make_undumpable()
        st.stop_requested = asyncio.Event()
        st.reaper.start(asyncio.get_running_loop())
        Path(scratch_dir(st.config)).mkdir(parents=True, exist_ok=True)
        # The pristine record (workspace, named files, the image's Python):
        # loaded if a previous run left it, else taken now (an image with
        # nothing to record imports none of reset's modules).
        from sandman.daemon.firstuse import prepare

        st.pristine = await prepare(st, default_workspace(st.config))
        st.started = True
        st.start_supervised()

    async def shutdown(self) -> None:
        st = self.state
        st.stopping = True
        await st.sessions.close_all()
        await st.background.close_all()
        await st.stop_supervised()
        st.reaper.stop()


def create_app(config: DaemonConfig, env: dict[str, str] | None = None) -> App:
    return App(config, env)


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


class JsonFormatter(logging.Formatter):
    """One JSON object per line (as sandman.logs.JsonFormatter; the daemon
    carries nothing of the sandman package but itself and the contract)."""

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


def exit_status(code: int | None) -> int:
    """A child's exit code (-N: killed by signal N) as a process exit status."""
    code = code or 0
    return code if code >= 0 else 128 - code


async def _serve(config: DaemonConfig) -> int:
    app = App(config, guard_memory=True)
    st = app.state
    await app.startup()
    server = HTTPServer(app.dispatch)
    await server.start(config.host, config.port)
    log.info("serving on %s (version %s, pid %d)", config.listen, st.version, os.getpid())
    loop = asyncio.get_running_loop()
    assert st.stop_requested is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, st.stop_requested.set)
    await st.stop_requested.wait()
    st.stopping = True
    if st.command_finished:
        # --exit-with-command: the command is done; answer what is in flight
        # (bounded), then stop the rest and leave with its exit code.
        log.info("original command exited (%s): finishing requests in flight", st.supervised_exit)
        await server.close(config.grace_s)
        await terminate_children(st.reaper, config.grace_s)
    else:
        log.info("stopping: SIGTERM to children, %.1fs grace", config.grace_s)
        await terminate_children(st.reaper, config.grace_s)
        await server.close(0.5)
    await app.shutdown()
    return exit_status(st.supervised_exit)


def serve(config: DaemonConfig) -> int:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    if os.getpid() != 1 and not become_subreaper():
        log.warning("could not become child subreaper; orphans may linger as zombies")
    return asyncio.run(_serve(config))
