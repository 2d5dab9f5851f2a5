"""`sandman port-forward POD [LOCAL:]REMOTE...`: a local port to a port inside a sandbox.

Through the Kubernetes ``pods/portforward`` API, as ``kubectl port-forward``
does, not a tunnel through the daemon:

- the kubelet (the container runtime) dials the port inside the pod's network
  namespace, so a server bound to 127.0.0.1 in the sandbox is reachable, and
  nothing in the sandbox can turn the daemon into a relay to other addresses;
- it needs no daemon code and no token, only RBAC (``pods/portforward``, in
  the sandman-user role), and it works wherever the apiserver is reachable;
- the NetworkPolicy of sandbox namespaces (only the daemon port, only from
  clients) stays as tight as it is: the traffic arrives through the kubelet.

The cost: a forwarded connection is not daemon activity, so a sandbox used
only through port-forward can be reclaimed as idle; keep the served process
running as a background process (``sandman exec -d``, which counts as use).

Wire protocol: the kubelet's WebSocket port-forward (subprotocol
``v4.channel.k8s.io``), one WebSocket per local connection: binary frames whose
first byte is the channel (0: data, 1: errors of the port); the first frame on
each channel carries the port number (2 bytes, little-endian).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp

from sandman.kube_async import ApiError, KubeClient

PROTOCOL = "v4.channel.k8s.io"
DATA, ERROR = 0, 1
PORT_PREFIX = 2  # bytes of the port number opening each channel
CHUNK = 64 * 1024


@dataclass(frozen=True)
class PortPair:
    local: int  # 0: any free port
    remote: int


def parse_ports(specs: list[str]) -> list[PortPair]:
    """kubectl's forms: ``8080`` (same port locally), ``9000:8080``, ``:8080`` (any local)."""
    out = []
    for spec in specs:
        local, sep, remote = spec.rpartition(":")
        try:
            r = int(remote)
            loc = (int(local) if local else 0) if sep else r
        except ValueError:
            msg = f"port {spec!r}: expected [LOCAL:]REMOTE, e.g. 8080 or 9000:8080"
            raise ValueError(msg) from None
        if not (1 <= r <= 65535 and 0 <= loc <= 65535):
            raise ValueError(f"port {spec!r}: ports are 1-65535 (local 0: any free port)")
        out.append(PortPair(loc, r))
    return out


class Forwarder:
    """Listens on local ports; each accepted connection gets its own stream to the pod."""

    def __init__(self, kube: KubeClient, namespace: str, pod: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pod = pod
        self.servers: list[asyncio.Server] = []
        self.errors: list[str] = []  # what the kubelet reported, per failed connection

    def _url(self, port: int) -> str:
        ns, pod = quote(self.namespace), quote(self.pod)
        path = f"/api/v1/namespaces/{ns}/pods/{pod}/portforward?ports={port}"
        return self.kube.creds.server + path

    async def open_stream(self, port: int) -> aiohttp.ClientWebSocketResponse:
        """A WebSocket to ``port`` in the pod (ApiError if the apiserver refuses)."""
        try:
            return await self.kube.session().ws_connect(
                self._url(port),
                protocols=(PROTOCOL,),
                # The kubelet's and the container runtime's port-forward routes
                # declare no media type, so go-restful answers 406 to the
                # client's usual `Accept: application/json`; kubectl sends none.
                headers={"Accept": "*/*", **(await self.kube.auth_headers())},
                autoping=True,
                **self.kube.request_options(),
            )
        except aiohttp.WSServerHandshakeError as e:
            raise ApiError(e.status, {"message": e.message or "port-forward refused"}) from None

    async def listen(self, pair: PortPair, address: str = "127.0.0.1") -> int:
        """Start listening for ``pair``; returns the local port (chosen if 0)."""

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._connection(pair.remote, reader, writer)

        server = await asyncio.start_server(handle, address, pair.local)
        self.servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def _connection(
        self, remote: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            ws = await self.open_stream(remote)
        except (ApiError, aiohttp.ClientError, OSError) as e:
            self._error(f"port {remote}: {e}")
            writer.close()
            return
        up = asyncio.create_task(_upstream(reader, ws))
        try:
            err = await _downstream(ws, writer)
            if err:
                self._error(f"port {remote}: {err}")
        finally:
            up.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await up
            await ws.close()
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def _error(self, msg: str) -> None:
        self.errors.append(msg)
        print(f"error: {msg}", file=sys.stderr, flush=True)

    async def close(self) -> None:
        for s in self.servers:
            s.close()
            await s.wait_closed()


async def _upstream(reader: asyncio.StreamReader, ws: aiohttp.ClientWebSocketResponse) -> None:
    # The protocol has no half-close: after the local side's EOF the stream
    # stays open for the answer until the pod's side ends it.
    while data := await reader.read(CHUNK):
        await ws.send_bytes(bytes([DATA]) + data)


async def _downstream(ws: aiohttp.ClientWebSocketResponse, writer: asyncio.StreamWriter) -> str:
    """Copy the pod's data to the local connection; returns the error channel's text."""
    skip = {DATA: PORT_PREFIX, ERROR: PORT_PREFIX}
    error = b""
    async for msg in ws:
        if msg.type != aiohttp.WSMsgType.BINARY or not msg.data:
            if msg.type in (aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSE):
                break
            continue
        channel, data = msg.data[0], msg.data[1:]
        if skip.get(channel):
            cut = min(skip[channel], len(data))
            data, skip[channel] = data[cut:], skip[channel] - cut
        if channel == DATA and data:
            writer.write(data)
            await writer.drain()
        elif channel == ERROR:
            error += data
    return error.decode(errors="replace").strip()


async def forward(
    kube: KubeClient,
    namespace: str,
    pod: str,
    pairs: list[PortPair],
    *,
    address: str = "127.0.0.1",
    announce: Callable[[str], None] = print,
    until: asyncio.Event | None = None,
) -> Forwarder:
    """Forward until ``until`` is set (or forever); prints kubectl's
    ``Forwarding from ADDR:LOCAL -> REMOTE`` per port once it listens."""
    fwd = Forwarder(kube, namespace, pod)
    try:
        for pair in pairs:
            port = await fwd.listen(pair, address)
            announce(f"Forwarding from {address}:{port} -> {pair.remote}")
        await (until or asyncio.Event()).wait()
    finally:
        await fwd.close()
    return fwd
