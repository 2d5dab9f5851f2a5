"""The target container's own readinessProbe, checked by the daemon (GET /readyz).

The webhook replaces the container's readinessProbe with the daemon's, so
that Ready means "the sandbox takes commands"; a server image whose own probe
said "my app is up" would lose that meaning. The webhook passes the original
Probe as ``--readiness-probe=JSON`` and points the kubelet at /readyz, which
is ready only when the daemon is AND the original probe passes.

Supported handlers are the three the kubelet runs itself: httpGet, tcpSocket
and exec. Ports must be numbers (the webhook resolves named ports, which the
daemon cannot see). Parsing is pure; checking does I/O.

/readyz needs no token (the kubelet has none), so anyone who reaches the pod
can call it. The probe is therefore run at most once per its own
``periodSeconds`` (as the kubelet would run it) and never twice at once:
``SharedCheck`` caches the last outcome for that period and lets concurrent
callers share the run in flight, so a flood of /readyz calls cannot turn into
a flood of the image's probe command.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# The kubelet's defaults for a Probe (core/v1 types.go): timeoutSeconds 1,
# periodSeconds 10. The period is also how long /readyz keeps an outcome: the
# kubelet asks once per period anyway, so the cost is that a change is seen up
# to one period later than with a fresh run per call (at most two periods in all).
DEFAULT_TIMEOUT_S = 1.0
DEFAULT_PERIOD_S = 10.0


def _port(value: Any, where: str) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError(
            f"--readiness-probe {where}.port must be a port number (named ports are resolved "
            f"by the webhook), got {value!r}"
        )
    return value


@dataclass(frozen=True)
class Probe:
    kind: str  # "http", "tcp" or "exec"
    timeout_s: float = DEFAULT_TIMEOUT_S
    period_s: float = DEFAULT_PERIOD_S
    host: str = "127.0.0.1"
    port: int = 0
    path: str = "/"
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, doc: Any) -> Probe:
        if not isinstance(doc, dict):
            raise ValueError("--readiness-probe must be a JSON object (a Kubernetes Probe)")
        timeout = doc.get("timeoutSeconds", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError("--readiness-probe timeoutSeconds must be a positive number")
        period = doc.get("periodSeconds", DEFAULT_PERIOD_S)
        if isinstance(period, bool) or not isinstance(period, int | float) or period <= 0:
            raise ValueError("--readiness-probe periodSeconds must be a positive number")
        handlers = [k for k in ("httpGet", "tcpSocket", "exec", "grpc") if k in doc]
        if len(handlers) != 1:
            raise ValueError(
                "--readiness-probe needs exactly one of httpGet, tcpSocket, exec; "
                f"got {handlers or 'none'}"
            )
        kind = handlers[0]
        spec = doc[kind]
        if not isinstance(spec, dict):
            raise ValueError(f"--readiness-probe {kind} must be an object")
        if kind == "grpc":
            raise ValueError("--readiness-probe: grpc probes are not supported by the daemon")
        if kind == "exec":
            cmd = spec.get("command")
            if not isinstance(cmd, list) or not cmd or not all(isinstance(a, str) for a in cmd):
                raise ValueError("--readiness-probe exec.command must be a non-empty string list")
            return cls("exec", float(timeout), float(period), command=tuple(cmd))
        host = spec.get("host") or "127.0.0.1"
        if not isinstance(host, str):
            raise ValueError(f"--readiness-probe {kind}.host must be a string")
        if kind == "tcpSocket":
            return cls(
                "tcp", float(timeout), float(period), host=host, port=_port(spec.get("port"), kind)
            )
        scheme = str(spec.get("scheme", "HTTP")).upper()
        if scheme not in ("HTTP", "HTTPS"):
            raise ValueError("--readiness-probe httpGet.scheme must be HTTP or HTTPS")
        path = spec.get("path", "/")
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError("--readiness-probe httpGet.path must start with /")
        headers = []
        for h in spec.get("httpHeaders") or []:
            if not isinstance(h, dict) or not isinstance(h.get("name"), str):
                raise ValueError("--readiness-probe httpGet.httpHeaders wants {name, value}")
            headers.append((h["name"], str(h.get("value", ""))))
        return cls(
            "http",
            float(timeout),
            float(period),
            host=host,
            port=_port(spec.get("port"), kind),
            path=path,
            scheme=scheme,
            headers=tuple(headers),
        )


RunExec = Callable[[tuple[str, ...], float], Awaitable[int]]
Outcome = tuple[bool, str]


def fresh(last_at: float | None, now: float, period_s: float) -> bool:
    """Whether an outcome taken at ``last_at`` still answers at ``now``."""
    return last_at is not None and 0 <= now - last_at < period_s


@dataclass
class SharedCheck:
    """The last probe outcome and the run in flight, shared by all /readyz callers.

    Prevents: /readyz is open to anyone who reaches the pod, and each call
    used to run the image's probe (an exec forks a process), so a loop of
    requests made the daemon fork without bound. Now a run starts only when
    the last outcome is older than the probe's period and none is running;
    everyone else awaits that run or reads the cached outcome. Prior art: the
    kubelet's prober runs each probe once per period whoever asks for status.

    Safe for concurrent coroutines on one event loop (the check-and-start has
    no await in it); not for threads. A caller that goes away does not cancel
    the shared run (it is shielded), so the others still get its outcome.
    """

    clock: Callable[[], float] = time.monotonic
    _last_at: float | None = None
    _last: Outcome = (False, "not probed yet")
    _running: asyncio.Task[Outcome] | None = None

    async def outcome(self, period_s: float, run: Callable[[], Awaitable[Outcome]]) -> Outcome:
        if fresh(self._last_at, self.clock(), period_s):
            return self._last
        if self._running is None:
            self._running = asyncio.ensure_future(self._run(run))
        return await asyncio.shield(self._running)

    async def _run(self, run: Callable[[], Awaitable[Outcome]]) -> Outcome:
        started = self.clock()
        try:
            result = await run()
        finally:
            self._running = None
        # Aged from the start: a slow probe does not stretch the period.
        self._last_at, self._last = started, result
        return result


async def check(probe: Probe, run_exec: RunExec) -> tuple[bool, str]:
    """(passed, why); never raises for a failing target."""
    try:
        return await asyncio.wait_for(_check(probe, run_exec), probe.timeout_s)
    except TimeoutError:
        return False, f"{probe.kind} probe timed out after {probe.timeout_s:g}s"
    except OSError as e:
        return False, f"{probe.kind} probe failed: {e.strerror or e}"


async def _check(probe: Probe, run_exec: RunExec) -> tuple[bool, str]:
    if probe.kind == "exec":
        code = await run_exec(probe.command, probe.timeout_s)
        return code == 0, f"exec probe exited {code}"
    if probe.kind == "tcp":
        _, writer = await asyncio.open_connection(probe.host, probe.port)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True, "tcp probe connected"
    ssl_ctx = None
    if probe.scheme == "HTTPS":
        import ssl  # lazily: most probes are plain HTTP, and ssl costs memory

        # As the kubelet does: HTTPS probes skip certificate verification.
        ssl_ctx = ssl.create_default_context()
        ssl_ctx.check_hostname = False
        ssl_ctx.verify_mode = ssl.CERT_NONE
    reader, writer = await asyncio.open_connection(probe.host, probe.port, ssl=ssl_ctx)
    try:
        head = [f"GET {probe.path} HTTP/1.1", f"Host: {probe.host}:{probe.port}"]
        head += ["User-Agent: sandmand-probe", "Connection: close"]
        head += [f"{k}: {v}" for k, v in probe.headers]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        line = await reader.readline()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    parts = line.split()
    status = int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0
    # The kubelet's rule: 200 <= status < 400 is success.
    return 200 <= status < 400, f"http probe answered {status or 'garbage'}"
