"""Every error the SDK raises is a SandmanError, and every one is documented.

Loopback stand-ins for the daemon and the apiserver fail the ways networks
do: nothing listening, a connection dropped before the answer, an answer cut
mid-stream, an answer that never comes, a 403, a 200 that is not JSON. The
SDK must raise its own error each time, the library's exception chained as
``__cause__``, never aiohttp's or asyncio's exception itself.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import sandman.client
from sandman.client import (
    ConfigError,
    KubernetesError,
    Sandbox,
    SandmanClient,
    SandmanError,
    StreamAborted,
    TransportError,
    WaitTimeout,
)
from sandman.client import errors as errors_mod
from sandman.client.transport import DaemonRequest, HttpTransport, Target
from sandman.kube_async import ApiError, Credentials, KubeClient, KubeconfigError
from sandman.tokens import namespace_key

SDK_DOC = Path(__file__).resolve().parents[3] / "docs" / "sdk.md"
KEY = namespace_key(b"k" * 32, "ns", "ns-uid")
POD = {
    "metadata": {"name": "sb", "namespace": "ns", "uid": "u", "labels": {"sandman.dev/id": "abc"}},
    "status": {"podIP": "127.0.0.1"},
}


# -- the documented tree ---------------------------------------------------------------
def documented_tree() -> dict[str, int]:
    """Class name -> depth in docs/sdk.md's error tree (the fenced block that
    starts with ``SandmanError``)."""
    text = SDK_DOC.read_text()
    block = re.search(r"```\n(SandmanError\n.*?)```", text, re.S)
    assert block, "docs/sdk.md has no error tree (a fenced block starting with SandmanError)"
    tree = {"SandmanError": 0}
    for line in block.group(1).splitlines()[1:]:
        m = re.match(r"^([│ ]*)[├└]── ([A-Z]\w+)", line)  # not a continuation line
        if m:
            tree[m.group(2)] = len(m.group(1)) // 4 + 1
    return tree


def exported_errors() -> list[type[BaseException]]:
    found = {
        obj
        for module in (sandman.client, errors_mod)
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__.startswith("sandman.client")
    }
    return sorted(found, key=lambda c: c.__name__)


def test_every_exported_error_is_a_sandman_error_and_documented_where_it_sits() -> None:
    tree = documented_tree()
    errors = exported_errors()
    assert StreamAborted in errors and len(errors) >= 12
    for cls in errors:
        assert issubclass(cls, SandmanError), cls
        assert cls.__name__ in tree, f"{cls.__name__} is not in docs/sdk.md's error tree"
        assert cls.__name__ in sandman.client.__all__, f"{cls.__name__} is not exported"
        if cls is not SandmanError:
            # Its parent in the doc is its SDK base class.
            parent = next(b for b in cls.__mro__[1:] if issubclass(b, SandmanError))
            assert tree[cls.__name__] == tree[parent.__name__] + 1, (cls, parent)
    assert set(tree) == {c.__name__ for c in errors}, "the doc lists an error the SDK lacks"


def test_the_translated_errors_stay_catchable_as_before() -> None:
    assert issubclass(KubernetesError, ApiError)
    assert issubclass(ConfigError, KubeconfigError)
    assert issubclass(WaitTimeout, TimeoutError)
    assert issubclass(TransportError, ConnectionError)  # callers that caught OSError
    assert str(TransportError("no route")) == "no route"
    e = KubernetesError(403, {"message": "pods is forbidden", "reason": "Forbidden"})
    assert (e.status, e.reason, e.retryable) == (403, "Forbidden", False)


# -- stand-ins ---------------------------------------------------------------------------
Serve = Callable[[Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]], int]


# Handlers that hold a connection open wait for this; set at each test's end.
DONE = asyncio.Event()


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[..., Awaitable[int]]]:
    """``serve(handler)``: a TCP server on 127.0.0.1; returns its port."""
    global DONE
    DONE = asyncio.Event()
    servers: list[asyncio.Server] = []

    async def serve(handler: Any) -> int:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    yield serve
    DONE.set()
    await asyncio.sleep(0)
    for s in servers:
        s.close()
        await s.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> None:
    await reader.readuntil(b"\r\n\r\n")


async def drop_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.close()


async def cut_mid_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    await writer.drain()
    writer.close()


async def stall_mid_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    await writer.drain()
    await DONE.wait()
    writer.close()


async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await DONE.wait()
    writer.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kube_at(port: int) -> KubeClient:
    return KubeClient(Credentials(f"http://127.0.0.1:{port}", ssl.create_default_context()))


async def client_with(daemon_port: int, api_port: int | None = None) -> SandmanClient:
    kube = kube_at(api_port or closed_port())
    transport = HttpTransport(kube, "direct", port=daemon_port)
    c = SandmanClient(kube=kube, namespace="ns", transport=transport, access_keys={"ns": KEY})
    await c.open()
    return c


def assert_translated(err: BaseException, cause: type[BaseException]) -> None:
    assert isinstance(err, SandmanError), type(err)
    assert isinstance(err.__cause__, cause), repr(err.__cause__)


# -- the daemon's side -----------------------------------------------------------------------
async def test_no_daemon_listening_is_a_transport_error() -> None:
    c = await client_with(closed_port())
    try:
        with pytest.raises(TransportError) as e:
            await Sandbox(c, POD).exec("true")
        assert_translated(e.value, aiohttp.ClientConnectorError)
    finally:
        await c.close()


async def test_a_dropped_connection_is_a_transport_error(raw_server) -> None:  # type: ignore[no-untyped-def]
    c = await client_with(await raw_server(drop_at_once))
    try:
        with pytest.raises(TransportError) as e:
            await Sandbox(c, POD).exec("true")
        assert_translated(e.value, aiohttp.ServerDisconnectedError)
    finally:
        await c.close()


@pytest.mark.parametrize("call", ["read_file", "read_file_chunks", "exec"])
async def test_an_answer_cut_mid_stream_is_a_transport_error(raw_server, call: str) -> None:  # type: ignore[no-untyped-def]
    c = await client_with(await raw_server(cut_mid_stream))
    sb = Sandbox(c, POD)
    try:
        with pytest.raises(TransportError) as e:
            if call == "read_file_chunks":
                async for _ in sb.read_file_chunks("/f"):
                    pass
            else:
                await getattr(sb, call)("/f")
        assert_translated(e.value, aiohttp.ClientPayloadError)
    finally:
        await c.close()


async def test_an_answer_that_never_comes_is_a_transport_error(raw_server) -> None:  # type: ignore[no-untyped-def]
    port = await raw_server(never_answer)
    kube = kube_at(closed_port())
    t = HttpTransport(kube, "direct", port=port)
    try:
        with pytest.raises(TransportError, match="no answer in") as e:
            await t.send(Target("ns", "sb", "127.0.0.1", "tok"), DaemonRequest("GET", "/x"), 0.2)
        assert_translated(e.value, TimeoutError)
    finally:
        await t.close()


async def test_an_answer_that_stalls_mid_stream_is_a_transport_error(raw_server) -> None:  # type: ignore[no-untyped-def]
    port = await raw_server(stall_mid_stream)
    t = HttpTransport(kube_at(closed_port()), "direct", port=port)
    try:
        resp = await t.send(Target("ns", "sb", "127.0.0.1", "tok"), DaemonRequest("GET", "/x"), 0.3)
        with pytest.raises(TransportError, match="timed out") as e:
            async for _ in resp.chunks():
                pass
        assert_translated(e.value, TimeoutError)
    finally:
        await t.close()


# -- the apiserver's side ------------------------------------------------------------------------
@pytest.fixture
async def apiserver() -> AsyncIterator[Callable[[web.Application], Awaitable[int]]]:
    runners: list[web.AppRunner] = []

    async def serve(app: web.Application) -> int:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return int(runner.addresses[0][1])

    yield serve
    for r in runners:
        await r.cleanup()


def answering(status: int, body: bytes, ctype: str = "application/json") -> web.Application:
    async def route(_request: web.Request) -> web.Response:
        return web.Response(status=status, body=body, content_type=ctype)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", route)
    return app


FORBIDDEN = (
    b'{"kind":"Status","status":"Failure","reason":"Forbidden","code":403,'
    b'"message":"pods \\"sb\\" is forbidden: User cannot get resource"}'
)


async def test_an_apiserver_that_is_not_there_is_a_transport_error() -> None:
    c = await client_with(closed_port())
    try:
        with pytest.raises(TransportError) as e:
            await Sandbox.create(c, "img", wait=False)
        assert_translated(e.value, aiohttp.ClientConnectorError)
        with pytest.raises(TransportError):
            await Sandbox.attach(c, "sb")
        with pytest.raises(TransportError):
            await Sandbox(c, POD).release()
    finally:
        await c.close()


async def test_an_apiserver_that_drops_the_connection_is_a_transport_error(raw_server) -> None:  # type: ignore[no-untyped-def]
    c = await client_with(closed_port(), await raw_server(drop_at_once))
    try:
        with pytest.raises(TransportError) as e:
            await Sandbox.attach(c, "sb")
        assert_translated(e.value, aiohttp.ServerDisconnectedError)
    finally:
        await c.close()


async def test_a_refusal_of_the_apiserver_is_a_kubernetes_error(apiserver) -> None:  # type: ignore[no-untyped-def]
    c = await client_with(closed_port(), await apiserver(answering(403, FORBIDDEN)))
    try:
        for call in (Sandbox.attach(c, "sb"), Sandbox(c, POD).release()):
            with pytest.raises(KubernetesError) as e:
                await call
            assert (e.value.status, e.value.reason) == (403, "Forbidden")
            assert "forbidden" in str(e.value) and isinstance(e.value.__cause__, ApiError)
        # The access key is read from a Secret: its refusal is the SDK's too.
        c._keys.clear()
        with pytest.raises(KubernetesError):
            await Sandbox(c, POD).exec("true")
    finally:
        await c.close()


async def test_an_apiserver_answer_that_is_not_json_is_a_transport_error(apiserver) -> None:  # type: ignore[no-untyped-def]
    c = await client_with(closed_port(), await apiserver(answering(200, b"<html>", "text/html")))
    try:
        with pytest.raises(TransportError, match="not JSON"):
            await Sandbox.attach(c, "sb")
    finally:
        await c.close()


def test_no_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        SandmanClient(kubeconfig=tmp_path / "nope")
    assert isinstance(e.value, KubeconfigError) and "nope" in str(e.value)
