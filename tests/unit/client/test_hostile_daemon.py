"""The SDK against a daemon the agent replaced: endless answers, deep JSON.

A daemon stand-in on 127.0.0.1 answers what an agent could make its daemon
answer. The SDK must stop reading once an answer passes its bound (typed
ResponseTooLarge, the rest never read: the stand-in counts what it could
send) and turn every answer it cannot parse into a ProtocolError, never a
RecursionError or a JSON decoder's exception.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from sandman.client import (
    DaemonError,
    ProtocolError,
    ResponseTooLarge,
    Sandbox,
    SandmanClient,
)
from sandman.client.bounded import MAX_JSON_BYTES
from sandman.client.transport import HttpTransport
from sandman.kube_async import Credentials, KubeClient
from sandman.tokens import namespace_key

KEY = namespace_key(b"k" * 32, "ns", "ns-uid")
POD = {
    "metadata": {"name": "sb", "namespace": "ns", "uid": "u", "labels": {"sandman.dev/id": "abc"}},
    "status": {"podIP": "127.0.0.1"},
}
MiB = 1 << 20
# What loopback socket buffers (both ends) can absorb after the reader stopped:
# a stand-in that got this far past the bound was read, not merely buffered.
SOCKET_SLACK = 32 * MiB
DEEP = b"[" * 200_000  # far past the JSON parser's recursion limit (~1000)

Route = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Endless:
    """Streams ``prefix`` then zeros until the client hangs up; counts what went."""

    def __init__(self, prefix: bytes = b"", status: int = 200, declared: int | None = None):
        self.prefix, self.status, self.declared = prefix, status, declared
        self.sent = 0
        self.ended = False

    async def route(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=self.status)
        if self.declared is not None:
            resp.content_length = self.declared
        await resp.prepare(request)
        try:
            await resp.write(self.prefix)
            while self.sent < 4096 * MiB:  # a bound for the test itself only
                await resp.write(b"0" * 65536)
                self.sent += 65536
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass
        self.ended = True
        return resp


def fixed(body: bytes, status: int = 200) -> Route:
    async def route(_request: web.Request) -> web.Response:
        return web.Response(body=body, status=status, content_type="application/json")

    return route


@pytest.fixture
async def daemon() -> AsyncIterator[Callable[[str, Route], Awaitable[Sandbox]]]:
    """``serve(path, route)``: a Sandbox whose daemon answers ``path`` with ``route``."""
    runners: list[web.AppRunner] = []
    clients: list[SandmanClient] = []

    async def serve(path: str, route: Route) -> Sandbox:
        app = web.Application()
        app.router.add_route("*", path, route)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        kube = KubeClient(Credentials("https://127.0.0.1:1", ssl.create_default_context()))
        transport = HttpTransport(kube, "direct", port=runner.addresses[0][1])
        c = SandmanClient(kube=kube, namespace="ns", transport=transport, access_keys={"ns": KEY})
        await c.open()
        clients.append(c)
        return Sandbox(c, POD)

    yield serve
    for c in clients:
        await c.close()
    for r in runners:
        await r.cleanup()


async def test_an_endless_file_stops_at_max_bytes(daemon) -> None:  # type: ignore[no-untyped-def]
    endless = Endless()
    sb = await daemon("/v1/files", endless.route)
    with pytest.raises(ResponseTooLarge) as e:
        await sb.read_file("/w/out.json", max_bytes=MiB)
    assert e.value.limit == MiB and "max_bytes" in e.value.message
    assert isinstance(e.value, DaemonError)
    assert endless.sent < MiB + SOCKET_SLACK  # the SDK hung up: nothing more was read


async def test_a_declared_length_past_the_bound_is_not_read_at_all(daemon) -> None:  # type: ignore[no-untyped-def]
    endless = Endless(declared=200 << 30)  # truncate -s 200G
    sb = await daemon("/v1/files", endless.route)
    with pytest.raises(ResponseTooLarge):
        await sb.read_file("/w/out.json", max_bytes=MiB)
    assert endless.sent < SOCKET_SLACK


async def test_an_endless_archive_stops_at_max_bytes(daemon) -> None:  # type: ignore[no-untyped-def]
    endless = Endless()
    sb = await daemon("/v1/files/tar", endless.route)
    with pytest.raises(ResponseTooLarge) as e:
        await sb.download_tar("/w", max_bytes=2 * MiB)
    assert e.value.limit == 2 * MiB
    assert endless.sent < 2 * MiB + SOCKET_SLACK


async def test_an_endless_json_answer_stops_at_the_api_bound(daemon) -> None:  # type: ignore[no-untyped-def]
    endless = Endless(prefix=b'{"pad": "')
    sb = await daemon("/v1/status", endless.route)
    with pytest.raises(ResponseTooLarge) as e:
        await sb.status()
    assert e.value.limit == MAX_JSON_BYTES
    assert endless.sent < MAX_JSON_BYTES + SOCKET_SLACK


async def test_an_endless_error_answer_is_read_only_for_its_message(daemon) -> None:  # type: ignore[no-untyped-def]
    endless = Endless(prefix=b'{"error": "', status=500)
    sb = await daemon("/v1/status", endless.route)
    with pytest.raises(DaemonError) as e:
        await sb.status()
    assert e.value.status == 500 and not isinstance(e.value, ResponseTooLarge)
    assert endless.sent < SOCKET_SLACK


async def test_deeply_nested_json_is_a_protocol_error(daemon) -> None:  # type: ignore[no-untyped-def]
    sb = await daemon("/v1/status", fixed(DEEP))
    with pytest.raises(ProtocolError) as e:
        await sb.status()
    assert e.value.code == "bad_answer" and "nested" in e.value.message


async def test_a_deeply_nested_error_answer_is_still_the_daemon_error(daemon) -> None:  # type: ignore[no-untyped-def]
    sb = await daemon("/v1/status", fixed(b'{"error": ' + DEEP, status=500))
    with pytest.raises(DaemonError) as e:
        await sb.status()
    assert e.value.status == 500


async def test_a_streamed_exec_with_deep_or_broken_records_is_a_protocol_error(daemon) -> None:  # type: ignore[no-untyped-def]
    sb = await daemon("/v1/exec", fixed(DEEP + b"\n"))
    with pytest.raises(ProtocolError):
        [x async for x in sb.exec_stream("true")]
    sb = await daemon("/v1/exec", fixed(b'{"no": "type"}\n'))
    with pytest.raises(ProtocolError):
        [x async for x in sb.exec_stream("true")]


async def test_a_streamed_exec_record_without_end_is_bounded(daemon) -> None:  # type: ignore[no-untyped-def]
    endless = Endless(prefix=b'{"type": "output", "data": "')
    sb = await daemon("/v1/exec", endless.route)
    with pytest.raises(ResponseTooLarge):
        [x async for x in sb.exec_stream("true")]
    assert endless.sent < MAX_JSON_BYTES + SOCKET_SLACK


async def test_files_are_returned_exactly_as_stored(daemon) -> None:  # type: ignore[no-untyped-def]
    """A file that happens to look like JSON is still just bytes: not parsed,
    not re-serialised, and deep nesting in it is no error."""
    for content in (b'{"a":   1}\n', DEEP, b"[not json"):
        sb = await daemon("/v1/files", fixed(content))
        assert await sb.read_file("/w/x.json") == content


async def test_a_file_streams_in_chunks_without_a_bound(daemon) -> None:  # type: ignore[no-untyped-def]
    sb = await daemon("/v1/files", fixed(b"x" * (3 * MiB)))
    got = 0
    async for chunk in sb.read_file_chunks("/w/big"):
        assert len(chunk) <= 4 * MiB
        got += len(chunk)
    assert got == 3 * MiB


async def test_a_deep_terminal_message_is_a_protocol_error(daemon) -> None:  # type: ignore[no-untyped-def]
    async def pty(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.receive()
        await ws.send_str(DEEP.decode())
        await ws.close()
        return ws

    sb = await daemon("/v1/pty", pty)
    with pytest.raises(ProtocolError):
        await sb.pty()
