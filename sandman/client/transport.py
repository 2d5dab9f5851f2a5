"""How requests reach a sandbox's daemon: directly, through the apiserver, or a mock.

- ``direct``: ``http://POD_IP:7878`` (in-cluster, or a host on the pod network
  such as the local cluster's).
- ``proxy``: the apiserver's ``pods/proxy`` subresource, with the caller's
  kubeconfig credentials (works from anywhere the apiserver is reachable; the
  token travels in ``X-Sandman-Token`` because the apiserver consumes
  ``Authorization``).
- ``MockTransport``: a handler function instead of a network, for unit tests.

One ``aiohttp`` connection pool serves every sandbox of a client, so
thousands of sandboxes cost a bounded number of sockets and keep-alive
connections are reused.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import aiohttp

from sandman.client.errors import TransportError
from sandman.contract import DAEMON_PORT
from sandman.kube_async import KubeClient

TOKEN_HEADER = "X-Sandman-Token"
# Direct connections kept open to one sandbox's daemon. Eight covers an agent's
# usual concurrency (a few commands, a file transfer, a long-poll); raise it
# (SandmanClient(max_per_sandbox=N)) when one sandbox serves many concurrent
# streams, e.g. the E2B gateway's one long-poll per streaming command. The
# proxy transport shares the apiserver pool (KubeClient's max_connections).
MAX_PER_SANDBOX = 8


@dataclass(frozen=True)
class Target:
    namespace: str
    name: str
    ip: str | None
    token: str


@dataclass
class DaemonRequest:
    method: str
    path: str
    params: Mapping[str, str] = field(default_factory=dict)
    json_body: Any = None
    data: bytes | AsyncIterator[bytes] | None = None


class DaemonResponse(Protocol):
    """A daemon's answer, read as it arrives: ``chunks()`` holds one chunk at a
    time; ``sandman.client.bounded.read_bounded`` reads a whole answer up to a
    bound. There is no unbounded ``read()``: what a daemon sends is written
    inside the sandbox."""

    status: int
    content_length: int | None  # as the answer declared it; None: chunked

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it comes; leaving the loop early drops the connection
        (the unread rest is never read)."""
        ...

    async def close(self) -> None: ...


class DaemonSocket(Protocol):
    """A WebSocket to the daemon (``/v1/pty``): messages both ways."""

    async def send_bytes(self, data: bytes) -> None: ...

    async def send_text(self, text: str) -> None: ...

    async def receive(self) -> bytes | str | None:
        """The next message (bytes: binary, str: text); None once closed."""
        ...

    async def close(self) -> None: ...


class Transport(Protocol):
    async def send(self, target: Target, req: DaemonRequest, timeout: float) -> DaemonResponse: ...

    async def websocket(self, target: Target, path: str, timeout: float) -> DaemonSocket: ...

    async def close(self) -> None: ...


class _AiohttpResponse:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.content_length = resp.content_length

    async def chunks(self) -> AsyncIterator[bytes]:  # type: ignore[override]
        # iter_any yields what has arrived; aiohttp pauses the socket while
        # its buffer holds more than 128 KiB, so one chunk stays that small.
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except TimeoutError as e:  # the call's timeout ran out mid-answer (aiohttp's too)
            raise TransportError(
                f"{self._resp.url.path}: the answer timed out ({type(e).__name__})"
            ) from e
        except (aiohttp.ClientError, OSError) as e:  # the body broke off (a cut chunked stream)
            raise TransportError(
                f"{self._resp.url.path}: the answer broke off: {e or type(e).__name__}"
            ) from e
        finally:
            # A body left unread makes aiohttp close the connection rather
            # than pool it: the rest is never read.
            self._resp.release()

    async def close(self) -> None:
        self._resp.release()


class _AiohttpSocket:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse, what: str) -> None:
        self._ws = ws
        self._what = what

    async def send_bytes(self, data: bytes) -> None:
        try:
            await self._ws.send_bytes(data)
        except (aiohttp.ClientError, ConnectionError) as e:
            raise TransportError(f"{self._what}: the connection broke off: {e}") from e

    async def send_text(self, text: str) -> None:
        try:
            await self._ws.send_str(text)
        except (aiohttp.ClientError, ConnectionError) as e:
            raise TransportError(f"{self._what}: the connection broke off: {e}") from e

    async def receive(self) -> bytes | str | None:
        try:
            msg = await self._ws.receive()
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise TransportError(f"{self._what}: the connection broke off: {e!r}") from e
        if msg.type == aiohttp.WSMsgType.BINARY:
            return bytes(msg.data)
        if msg.type == aiohttp.WSMsgType.TEXT:
            return str(msg.data)
        if msg.type == aiohttp.WSMsgType.ERROR:
            raise TransportError(f"{self._what}: the connection broke off: {msg.data}")
        return None  # CLOSE, CLOSING, CLOSED

    async def close(self) -> None:
        try:
            await self._ws.close()
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise TransportError(f"{self._what}: closing: {e!r}") from e


# What aiohttp needs to open a WebSocket: the handshake within the call's
# timeout; afterwards no receive timeout (a terminal may sit idle for hours).
def _ws_timeout(timeout: float) -> aiohttp.ClientWSTimeout:
    return aiohttp.ClientWSTimeout(ws_receive=None, ws_close=min(timeout, 10.0))


class HttpTransport:
    """Direct to pod IPs, or through the apiserver; chosen per client.

    Safe for concurrent use by the tasks of one event loop.
    """

    def __init__(
        self,
        kube: KubeClient,
        mode: str = "auto",
        *,
        max_connections: int = 1000,
        max_per_sandbox: int = MAX_PER_SANDBOX,
        port: int = DAEMON_PORT,
    ) -> None:
        if mode not in ("auto", "direct", "proxy"):
            raise ValueError("transport mode must be auto, direct or proxy")
        self.kube = kube
        self.mode = mode
        self.port = port
        self._direct = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_connections, limit_per_host=max_per_sandbox),
        )
        self._decided: str | None = None if mode == "auto" else mode
        self._decide_lock = asyncio.Lock()

    async def _choose(self, target: Target) -> str:
        if self._decided is not None:
            return self._decided
        async with self._decide_lock:
            if self._decided is None:
                self._decided = "direct" if await self._reachable(target) else "proxy"
            return self._decided

    async def _reachable(self, target: Target) -> bool:
        if not target.ip:
            return False
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(target.ip, self.port), timeout=1.0
            )
        except (OSError, TimeoutError):
            return False
        writer.close()
        return True

    @property
    def chosen(self) -> str | None:
        return self._decided

    async def daemon_ready(self, ip: str, timeout: float = 1.0) -> bool | None:
        """Whether the daemon at ``ip`` answers ``GET /readyz`` with 200 (no
        token: the path reveals nothing); None when this transport goes
        through the apiserver, which only the pod's Ready condition should
        be asked for. A direct answer settles ``auto`` on ``direct``."""
        if self._decided == "proxy":
            return None
        try:
            async with self._direct.get(
                f"http://{ip}:{self.port}/readyz", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                ok = resp.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False
        if ok and self._decided is None:
            self._decided = "direct"
        return ok

    async def send(self, target: Target, req: DaemonRequest, timeout: float) -> DaemonResponse:
        mode = await self._choose(target)
        headers = {TOKEN_HEADER: target.token}
        body: Any = req.data
        if req.json_body is not None:
            body = json.dumps(req.json_body).encode()
            headers["Content-Type"] = "application/json"
        query = ("?" + urlencode(dict(req.params))) if req.params else ""
        client_timeout = aiohttp.ClientTimeout(total=timeout)
        try:
            if mode == "direct":
                if not target.ip:
                    raise TransportError(f"sandbox {target.name} has no pod IP yet")
                headers["Authorization"] = f"Bearer {target.token}"
                url = f"http://{target.ip}:{self.port}{req.path}{query}"
                resp = await self._direct.request(
                    req.method, url, data=body, headers=headers, timeout=client_timeout
                )
            else:
                session = self.kube.session()
                url = (
                    f"{self.kube.creds.server}/api/v1/namespaces/{quote(target.namespace)}"
                    f"/pods/{quote(target.name)}:{self.port}/proxy{req.path}{query}"
                )
                resp = await session.request(
                    req.method,
                    url,
                    data=body,
                    headers={**(await self.kube.auth_headers()), **headers},
                    timeout=client_timeout,
                    # Chunked, not Content-Length: the apiserver's proxy (Go's
                    # ReverseProxy) re-reads a Content-Length body after sending
                    # it; when the daemon answers first, the Go server has closed
                    # that body, the read fails and the proxy cuts the answer
                    # mid-stream (golang/go#40747, seen under load). A chunked
                    # body ends only when the proxy has read all of it.
                    chunked=True if body else None,
                    **self.kube.request_options(),
                )
        except TimeoutError as e:  # no answer within the call's timeout (aiohttp's too)
            raise TransportError(
                f"sandbox {target.namespace}/{target.name}: {req.method} {req.path}: "
                f"no answer in {timeout:g}s ({type(e).__name__})"
            ) from e
        except (aiohttp.ClientError, OSError) as e:
            raise TransportError(
                f"sandbox {target.namespace}/{target.name}: {e or type(e).__name__}"
            ) from e
        return _AiohttpResponse(resp)

    async def websocket(self, target: Target, path: str, timeout: float) -> DaemonSocket:
        """A WebSocket to ``path``, directly or through the apiserver's pods/proxy
        (which passes HTTP upgrades through to the pod). The handshake must
        finish within ``timeout``; the socket then lives until closed."""
        mode = await self._choose(target)
        headers = {TOKEN_HEADER: target.token}
        what = f"sandbox {target.namespace}/{target.name}"
        try:
            async with asyncio.timeout(timeout):
                if mode == "direct":
                    if not target.ip:
                        raise TransportError(f"sandbox {target.name} has no pod IP yet")
                    headers["Authorization"] = f"Bearer {target.token}"
                    ws = await self._direct.ws_connect(
                        f"http://{target.ip}:{self.port}{path}",
                        headers=headers,
                        timeout=_ws_timeout(timeout),
                        autoping=True,
                    )
                else:
                    url = (
                        f"{self.kube.creds.server}/api/v1/namespaces/{quote(target.namespace)}"
                        f"/pods/{quote(target.name)}:{self.port}/proxy{path}"
                    )
                    ws = await self.kube.session().ws_connect(
                        url,
                        headers={**(await self.kube.auth_headers()), **headers},
                        timeout=_ws_timeout(timeout),
                        autoping=True,
                        **self.kube.request_options(),
                    )
        except aiohttp.WSServerHandshakeError as e:
            raise _handshake_error(e, what) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise TransportError(f"{what}: {e or type(e).__name__}") from e
        return _AiohttpSocket(ws, what)

    async def close(self) -> None:
        await self._direct.close()


def _handshake_error(e: aiohttp.WSServerHandshakeError, what: str) -> Exception:
    """A refused upgrade: the daemon's (or the apiserver's) status, as the SDK's errors."""
    from sandman.client.errors import DaemonError, Unauthorized

    if e.status == 401:
        return Unauthorized(401, "unauthorized", f"{what}: {e.message}")
    if e.status in (502, 503, 504) or e.status < 400:
        return TransportError(f"{what}: HTTP {e.status} on the way to the daemon: {e.message}")
    return DaemonError(e.status, "upgrade_refused", f"{what}: {e.message}")


# -- a transport for unit tests ------------------------------------------------------
@dataclass
class MockResponse:
    status: int
    body: bytes = b""

    @classmethod
    def json(cls, status: int, doc: Any) -> MockResponse:
        return cls(status, json.dumps(doc).encode())

    @property
    def content_length(self) -> int | None:
        return len(self.body)

    async def chunks(self) -> AsyncIterator[bytes]:  # type: ignore[override]
        yield self.body

    async def close(self) -> None:
        return None


Handler = Callable[[Target, DaemonRequest], Awaitable[MockResponse]]


class MockTransport:
    """Calls ``handler`` instead of a daemon (httpx's MockTransport idea)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[tuple[Target, DaemonRequest]] = []

    async def send(self, target: Target, req: DaemonRequest, timeout: float) -> DaemonResponse:
        self.requests.append((target, req))
        return await self.handler(target, req)

    async def websocket(self, target: Target, path: str, timeout: float) -> DaemonSocket:
        raise TransportError(f"MockTransport has no WebSocket ({path}): test terminals on a daemon")

    async def close(self) -> None:
        return None
