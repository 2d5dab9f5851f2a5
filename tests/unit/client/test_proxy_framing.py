"""How the SDK frames request bodies it sends through the apiserver's pods/proxy.

The apiserver proxies with Go's ReverseProxy. With a Content-Length body it
re-reads the body after sending it; when the daemon answers before that read,
Go's HTTP/1 server has already closed the body, the read fails and the proxy
cuts the answer mid-stream (golang/go#40747; seen in CI as "the answer broke
off" from a streamed exec under load). A chunked body cannot race: the proxy
sends its last chunk only after it has read the whole body. A loopback
endpoint stands where the apiserver's pods/proxy would be and records what
arrives on the wire.
"""

from __future__ import annotations

import ssl
from typing import Any

from aiohttp import web

from sandman.client.bounded import read_bounded
from sandman.client.transport import DaemonRequest, HttpTransport, Target
from sandman.kube_async import Credentials, KubeClient

TARGET = Target(name="sb", namespace="ns", ip=None, token="t")


async def _endpoint(seen: list[dict[str, Any]]) -> tuple[web.AppRunner, int]:
    async def handle(request: web.Request) -> web.Response:
        seen.append(
            {
                "path": request.path,
                "te": request.headers.get("Transfer-Encoding"),
                "length": request.headers.get("Content-Length"),
                "body": await request.read(),
            }
        )
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


async def test_bodies_through_the_apiserver_proxy_are_chunked() -> None:
    seen: list[dict[str, Any]] = []
    runner, port = await _endpoint(seen)
    try:
        creds = Credentials(f"http://127.0.0.1:{port}", ssl.create_default_context(), token="x")
        async with KubeClient(creds) as kube:
            transport = HttpTransport(kube, "proxy")
            try:
                for req in (
                    DaemonRequest("POST", "/v1/exec", json_body={"cmd": ["true"]}),
                    DaemonRequest("PUT", "/v1/files", {"path": "/tmp/f"}, data=b"x" * 100_000),
                    DaemonRequest("GET", "/v1/status"),
                ):
                    resp = await transport.send(TARGET, req, timeout=10)
                    body = await read_bounded(resp, 1 << 20, what="test", remedy="")
                    assert body == b'{"ok": true}'
            finally:
                await transport.close()
    finally:
        await runner.cleanup()
    exec_, upload, status = seen
    assert exec_["path"] == "/api/v1/namespaces/ns/pods/sb:7878/proxy/v1/exec"
    assert (exec_["te"], exec_["length"], exec_["body"]) == ("chunked", None, b'{"cmd": ["true"]}')
    assert (upload["te"], upload["length"], upload["body"]) == ("chunked", None, b"x" * 100_000)
    # No body, nothing to frame: a GET goes as it always did.
    assert (status["te"], status["body"]) == (None, b"")
