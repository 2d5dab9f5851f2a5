"""`sandman port-forward`'s wire protocol against a stand-in for the kubelet.

The stand-in speaks what the kubelet's streaming server speaks on a WebSocket
port-forward (k8s.io/kubelet/pkg/cri/streaming/portforward/websocket.go,
subprotocol v4.channel.k8s.io): the port number opens both channels, data
goes on channel 0 with a one-byte channel prefix, a failed dial is reported
on channel 1 and the socket closes. The real kubelet is in
tests/e2e/test_kubectl_user.py; here each byte path is checked precisely.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from sandman.cli.portforward import PROTOCOL, Forwarder, PortPair, parse_ports
from sandman.kube_async import Credentials, KubeClient


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A server inside the "pod", HTTP/1.0-like: reads one request (a line),
    answers it upper-cased and closes (the protocol has no half-close, so the
    pod side ends a connection)."""
    writer.write((await reader.readline()).upper())
    await writer.drain()
    writer.close()


@pytest.fixture
async def kubelet() -> AsyncIterator[tuple[str, int, list[str]]]:
    inside = await asyncio.start_server(_echo, "127.0.0.1", 0)
    inside_port = inside.sockets[0].getsockname()[1]
    seen: list[str] = []

    async def portforward(request: web.Request) -> web.StreamResponse:
        seen.append(request.path_qs)
        if request.headers.get("Accept") not in (None, "*/*"):
            # go-restful's answer for a route that declares no media type
            return web.Response(status=406, text="406: Not Acceptable")
        port = int(request.query["ports"])
        ws = web.WebSocketResponse(protocols=(PROTOCOL,))
        await ws.prepare(request)
        prefix = struct.pack("<H", port)
        await ws.send_bytes(b"\x00" + prefix)
        await ws.send_bytes(b"\x01" + prefix)
        target = inside_port if port == 8080 else 1  # nothing listens on 1
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError as e:
            await ws.send_bytes(b"\x01" + f"error forwarding port {port}: {e}".encode())
            await ws.close()
            return ws

        async def down() -> None:
            while data := await reader.read(65536):
                # Split oddly: a frame boundary inside the data must not matter.
                for i in range(0, len(data), 3):
                    await ws.send_bytes(b"\x00" + data[i : i + 3])
            await ws.close()

        task = asyncio.create_task(down())
        async for msg in ws:
            assert msg.data[0] == 0, "client data goes on channel 0"
            writer.write(msg.data[1:])
            await writer.drain()
        writer.close()
        await task
        return ws

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}/portforward", portforward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", inside_port, seen
    await runner.cleanup()
    inside.close()


async def test_bytes_flow_both_ways_per_connection(kubelet: tuple[str, int, list[str]]) -> None:
    url, _, seen = kubelet
    async with KubeClient(Credentials(url, ssl.create_default_context(), token="t")) as kube:
        fwd = Forwarder(kube, "ns", "sb-1")
        port = await fwd.listen(PortPair(0, 8080))
        for _ in range(2):  # each connection: its own stream
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"hello ")
            await writer.drain()
            writer.write(b"world\n")
            await writer.drain()
            assert await reader.read() == b"HELLO WORLD\n"  # all, then the pod side closed
            writer.close()
        await fwd.close()
    assert seen == ["/api/v1/namespaces/ns/pods/sb-1/portforward?ports=8080"] * 2
    assert fwd.errors == []


async def test_a_refused_dial_is_reported_and_the_connection_closed(
    kubelet: tuple[str, int, list[str]],
) -> None:
    url, _, _ = kubelet
    async with KubeClient(Credentials(url, ssl.create_default_context(), token="t")) as kube:
        fwd = Forwarder(kube, "ns", "sb-1")
        port = await fwd.listen(PortPair(0, 9999))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await reader.read() == b""
        writer.close()
        await fwd.close()
    assert len(fwd.errors) == 1 and "error forwarding port 9999" in fwd.errors[0]


async def test_a_refused_stream_names_the_status(kubelet: tuple[str, int, list[str]]) -> None:
    url, _, _ = kubelet
    async with KubeClient(Credentials(url, ssl.create_default_context(), token="t")) as kube:
        fwd = Forwarder(kube, "ns", "missing/x")  # no such route: 404
        port = await fwd.listen(PortPair(0, 8080))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await reader.read() == b""
        writer.close()
        await fwd.close()
    assert len(fwd.errors) == 1 and "404" in fwd.errors[0], fwd.errors


def test_port_specs_as_kubectl_writes_them() -> None:
    assert parse_ports(["8080", "9000:80", ":7000"]) == [
        PortPair(8080, 8080), PortPair(9000, 80), PortPair(0, 7000),
    ]  # fmt: skip
    for bad in ("x", "0", "70000", "1:2:3", "-1:80"):
        with pytest.raises(ValueError, match="port"):
            parse_ports([bad])
