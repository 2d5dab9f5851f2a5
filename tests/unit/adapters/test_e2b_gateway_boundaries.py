"""The E2B gateway against whoever reaches its port, and against a hostile daemon.

The gateway runs on 127.0.0.1 with one sandbox entry whose daemon is a
stand-in on 127.0.0.1 (it counts the calls it gets and keeps what is
written). Requests go over raw sockets where the framing matters (chunked
bodies without an end). What the gateway read of a request body is measured
on the request itself (``content.total_bytes``, the bytes its parser took in).
"""

from __future__ import annotations

import asyncio
import gzip
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from sandman.adapters.e2b.connect import MAX_MESSAGE_BYTES
from sandman.adapters.e2b.gateway import GATEWAY, GatewayConfig, create_app
from sandman.client import Sandbox, SandmanClient
from sandman.client.transport import HttpTransport
from sandman.contract import LABEL_E2B
from sandman.kube_async import Credentials, KubeClient
from sandman.tokens import namespace_key

KEY = namespace_key(b"k" * 32, "ns", "ns-uid")
API_KEY = "gateway-key"
SID = "sb-1"
POD = {
    "metadata": {
        "name": SID,
        "namespace": "ns",
        "uid": "u",
        "labels": {"sandman.dev/id": "abc", LABEL_E2B: "true"},
    },
    "status": {"podIP": "127.0.0.1"},
}
MiB = 1 << 20
UPLOAD_LIMIT = 4 * MiB
# What the parser may take in with the headers before a handler runs: the
# first segments on the socket (the client below sends 1 KiB of body first).
READ_BEFORE_REFUSAL = 16 * 1024


@dataclass
class Daemon:
    """What the daemon stand-in saw, and what it serves as a file."""

    calls: list[str] = field(default_factory=list)
    written: dict[str, bytes] = field(default_factory=dict)
    file: bytes = b""
    endless: bool = False
    missing: bool = False
    sent: int = 0

    async def status(self, request: web.Request) -> web.Response:
        self.calls.append("status")
        return web.json_response({"ok": True})

    async def put_file(self, request: web.Request) -> web.Response:
        self.calls.append("put")
        self.written[request.query["path"]] = await request.read()
        return web.json_response({"path": request.query["path"]}, status=201)

    async def get_file(self, request: web.Request) -> web.StreamResponse:
        self.calls.append("get")
        if self.missing:
            return web.json_response({"error": {"code": "not_found", "message": "no"}}, status=404)
        if not self.endless:
            return web.Response(body=self.file)
        resp = web.StreamResponse()
        await resp.prepare(request)
        try:
            while self.sent < 4096 * MiB:  # a bound for the test itself only
                await resp.write(b"\0" * 65536)
                self.sent += 65536
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass
        return resp


@dataclass
class Setup:
    daemon: Daemon
    port: int
    token: str  # the sandbox's envd access token
    requests: list[web.Request]  # every request the gateway got, in order


@pytest.fixture
async def gateway() -> AsyncIterator[Setup]:
    daemon = Daemon()
    dapp = web.Application(client_max_size=64 * MiB)
    dapp.router.add_get("/v1/status", daemon.status)
    dapp.router.add_get("/v1/files", daemon.get_file)
    dapp.router.add_put("/v1/files", daemon.put_file)
    drunner = web.AppRunner(dapp)
    await drunner.setup()
    await web.TCPSite(drunner, "127.0.0.1", 0).start()

    kube = KubeClient(Credentials("https://127.0.0.1:1", ssl.create_default_context()))
    transport = HttpTransport(kube, "direct", port=drunner.addresses[0][1])
    client = SandmanClient(kube=kube, namespace="ns", transport=transport, access_keys={"ns": KEY})
    await client.open()
    config = GatewayConfig(namespace="ns", api_key=API_KEY, max_upload_bytes=UPLOAD_LIMIT)
    app = create_app(config, client)
    requests: list[web.Request] = []

    @web.middleware
    async def record(request: web.Request, handler):  # type: ignore[no-untyped-def]
        requests.append(request)
        return await handler(request)

    app.middlewares.insert(0, record)
    gw = app[GATEWAY]
    gw.add(Sandbox(client, POD)).home = "/root"
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield Setup(daemon, runner.addresses[0][1], gw.access_token(SID), requests)
    finally:
        await runner.cleanup()
        await client.close()
        await drunner.cleanup()


async def _chunked_head(
    port: int, path: str, headers: dict[str, str]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"POST {path} HTTP/1.1", "Host: gw", "Transfer-Encoding: chunked"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    return reader, writer


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def _send_quietly(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write and drain; a peer that closed is what some tests expect."""
    try:
        writer.write(data)
        await writer.drain()
    except (ConnectionError, OSError):
        pass


@pytest.mark.parametrize(
    ("path", "ctype", "status", "says"),
    [
        ("/process.Process/List", "application/json", b"401", b"X-Access-Token"),
        # A stream answers its error in the end-of-stream envelope, status 200.
        ("/process.Process/Start", "application/connect+json", b"200", b"unauthenticated"),
        ("/filesystem.Filesystem/WatchDir", "application/connect+json", b"200", b"unauth"),
        ("/files?path=/tmp/x", "application/octet-stream", b"401", b"X-Access-Token"),
        ("/v2/sandboxes", "application/json", b"401", b"X-API-KEY"),
        ("/no/such/route", "application/json", b"404", b""),
    ],
)
async def test_a_stranger_s_chunked_body_is_refused_before_it_is_read(
    gateway: Setup, path: str, ctype: str, status: bytes, says: bytes
) -> None:
    """No credential: the answer comes while the body is still arriving (none
    of it was waited for), the connection is closed, and the rest is never
    read (not even drained)."""
    reader, writer = await _chunked_head(
        gateway.port, path, {"Content-Type": ctype, "E2b-Sandbox-Id": SID}
    )
    await _send_quietly(writer, _chunk(b"{" * 1024))
    line = await asyncio.wait_for(reader.readline(), 5)
    assert line.split()[1] == status
    rest = await asyncio.wait_for(reader.read(), 5)  # the gateway closes the connection
    assert says in rest  # the refusal names what is missing
    for _ in range(64):  # 4 MiB more that nobody should read
        await _send_quietly(writer, _chunk(b"x" * 65536))
    writer.close()
    (request,) = gateway.requests
    assert request.content.total_bytes <= READ_BEFORE_REFUSAL
    assert gateway.daemon.calls == []


async def test_a_chunked_message_over_the_bound_is_413(gateway: Setup) -> None:
    """With the token: the message is counted as it arrives; past 4 MiB the
    call is refused with 413 and the rest is not read (no Content-Length to
    trust: the body is chunked)."""
    reader, writer = await _chunked_head(
        gateway.port,
        "/process.Process/List",
        {
            "Content-Type": "application/json",
            "E2b-Sandbox-Id": SID,
            "X-Access-Token": gateway.token,
        },
    )

    async def flood() -> None:
        for _ in range(2 * MAX_MESSAGE_BYTES // 65536):
            await _send_quietly(writer, _chunk(b" " * 65536))

    sending = asyncio.create_task(flood())
    status = await asyncio.wait_for(reader.readline(), 10)
    await sending
    writer.close()
    assert status.split()[1] == b"413"
    (request,) = gateway.requests
    assert request.content.total_bytes < MAX_MESSAGE_BYTES + 1 * MiB


async def test_a_control_plane_body_over_the_bound_is_413(gateway: Setup) -> None:
    async with aiohttp.ClientSession() as http:

        async def body() -> AsyncIterator[bytes]:
            for _ in range(2 * MAX_MESSAGE_BYTES // 65536):
                yield b" " * 65536

        try:
            async with http.post(
                f"http://127.0.0.1:{gateway.port}/v2/sandboxes",
                data=body(),
                headers={"X-API-KEY": API_KEY, "Content-Type": "application/json"},
            ) as r:
                status = r.status
        except aiohttp.ClientError:
            status = None  # the connection closed under a body still being sent
    (request,) = gateway.requests
    assert status in (413, None)
    assert request.content.total_bytes < MAX_MESSAGE_BYTES + 1 * MiB


async def test_deep_json_from_a_client_is_a_400(gateway: Setup) -> None:
    async with aiohttp.ClientSession() as http:
        r = await http.post(
            f"http://127.0.0.1:{gateway.port}/filesystem.Filesystem/Stat",
            data=b"[" * 100_000,
            headers={
                "Content-Type": "application/json",
                "E2b-Sandbox-Id": SID,
                "X-Access-Token": gateway.token,
            },
        )
        assert r.status == 400 and (await r.json())["code"] == "invalid_argument"
        r = await http.post(
            f"http://127.0.0.1:{gateway.port}/v2/sandboxes/{SID}/connect",
            data=b"[" * 100_000,
            headers={"X-API-KEY": API_KEY, "Content-Type": "application/json"},
        )
        assert r.status == 400 and "nested" in (await r.json())["message"]


async def test_health_without_a_key_tells_nothing_about_sandboxes(gateway: Setup) -> None:
    """Without a sandbox id: the gateway's own health. With one but without
    its token: the same refusal for a sandbox that exists and one that does
    not, and the daemon is never called."""
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{gateway.port}/health"
        assert (await http.get(url)).status == 204
        exists = await http.get(url, headers={"E2b-Sandbox-Id": SID})
        missing = await http.get(url, headers={"E2b-Sandbox-Id": "no-such-sandbox"})
        wrong = await http.get(url, headers={"E2b-Sandbox-Id": SID, "X-Access-Token": "x"})
        assert exists.status == missing.status == wrong.status == 401
        assert await exists.read() == await missing.read()  # no name, no existence
        assert gateway.daemon.calls == []
        ok = await http.get(url, headers={"E2b-Sandbox-Id": SID, "X-Access-Token": gateway.token})
        assert ok.status == 204 and gateway.daemon.calls == ["status"]


def _upload_headers(gateway: Setup, **extra: str) -> dict[str, str]:
    return {
        "E2b-Sandbox-Id": SID,
        "X-Access-Token": gateway.token,
        "Content-Type": "application/octet-stream",
        **extra,
    }


async def test_a_gz_file_is_stored_byte_for_byte(gateway: Setup) -> None:
    """A .gz file, sent plain or with Content-Encoding: gzip (the body
    compressed once more), arrives as the same .gz file: decoded once, never
    twice."""
    archive = gzip.compress(b"log line\n" * 1000)
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{gateway.port}/files"
        r = await http.post(
            url, params={"path": "/w/plain.gz"}, data=archive, headers=_upload_headers(gateway)
        )
        assert r.status == 200
        r = await http.post(
            url,
            params={"path": "/w/encoded.gz"},
            data=gzip.compress(archive),
            headers=_upload_headers(gateway, **{"Content-Encoding": "gzip"}),
        )
        assert r.status == 200
    assert gateway.daemon.written == {"/w/plain.gz": archive, "/w/encoded.gz": archive}


async def test_a_gzip_bomb_stops_at_the_upload_bound(gateway: Setup) -> None:
    """64 MiB of zeros in ~64 KiB of gzip, as Content-Encoding and again
    inside: decoding stops at the upload bound (4 MiB here), nothing goes to
    the daemon, and the inner gzip is never opened."""
    bomb = gzip.compress(b"\0" * (64 * MiB))
    async with aiohttp.ClientSession() as http:
        for path, body in (("/w/bomb", bomb), ("/w/double", gzip.compress(bomb))):
            r = await http.post(
                f"http://127.0.0.1:{gateway.port}/files",
                params={"path": path},
                data=body,
                headers=_upload_headers(gateway, **{"Content-Encoding": "gzip"}),
            )
            if path == "/w/bomb":
                assert r.status == 413 and "4194304" in (await r.json())["message"]
            else:  # the inner bomb is just bytes of a file, stored as sent
                assert r.status == 200
    assert gateway.daemon.written == {"/w/double": bomb}


async def test_file_reads_stream_through_the_gateway(gateway: Setup) -> None:
    """An endless file is passed on a chunk at a time: the client reads 32 MiB
    of it and hangs up, and the daemon could send little more than that (the
    gateway held no whole file; before, it buffered until memory ran out)."""
    gateway.daemon.endless = True
    got = 0
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"http://127.0.0.1:{gateway.port}/files",
            params={"path": "/w/out.json"},
            headers={"E2b-Sandbox-Id": SID, "X-Access-Token": gateway.token},
            timeout=aiohttp.ClientTimeout(total=30),
        ) as r,
    ):
        assert r.status == 200
        async for chunk in r.content.iter_any():
            got += len(chunk)
            if got >= 32 * MiB:
                break
    for _ in range(100):
        if gateway.daemon.sent and gateway.daemon.calls == ["get"]:
            break
        await asyncio.sleep(0.05)
    assert got >= 32 * MiB
    assert gateway.daemon.sent < 32 * MiB + 64 * MiB  # socket buffers on two hops


async def test_a_missing_file_is_still_a_404(gateway: Setup) -> None:
    gateway.daemon.missing = True
    async with aiohttp.ClientSession() as http:
        r = await http.get(
            f"http://127.0.0.1:{gateway.port}/files",
            params={"path": "/w/none"},
            headers={"E2b-Sandbox-Id": SID, "X-Access-Token": gateway.token},
        )
        assert r.status == 404
