"""The API app in-process (its own HTTP server on a free port, aiohttp as the
client): routing, auth, errors, files.

Only endpoints that start no processes are driven here; the ones that do run
against a real daemon process (see helpers.py for why).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sandman.daemon.config import DaemonConfig
from sandman.daemon.http import HTTPServer
from sandman.daemon.server import create_app

TOKEN = "in-process"


class TestClient:
    """Just enough of a client: relative paths on one aiohttp session."""

    __test__ = False

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    def request(self, method: str, path: str, **kw: Any) -> Any:
        return self.session.request(method, self.base + path, **kw)

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def put(self, path: str, **kw: Any) -> Any:
        return self.request("PUT", path, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)


@pytest.fixture
async def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[TestClient]:
    # Not a git checkout: no workspace is detected, so nothing is spawned.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    config = DaemonConfig(
        token_sha256=hashlib.sha256(TOKEN.encode()).hexdigest(),
        daemon_dir=tmp_path / "d",
        temp_dirs=(),
    )
    app = create_app(config, env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path / "d")})
    app.state.started = True  # no startup(): it would install a SIGCHLD handler here
    server = HTTPServer(app.dispatch)
    port = await server.start("127.0.0.1", 0)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        yield TestClient(session, f"http://127.0.0.1:{port}")
    await server.close(1.0)


async def test_routes_answer_json_errors(client: TestClient) -> None:
    r = await client.get("/v1/sessions")
    assert r.status == 200 and await r.json() == {"sessions": []}
    r = await client.get("/v1/processes")
    assert r.status == 200 and await r.json() == {"processes": []}
    for method, path, status in (
        ("GET", "/v1/sessions/nope", 404),
        ("DELETE", "/v1/processes/nope", 404),
        ("POST", "/v1/processes/nope/wait", 404),
        ("PATCH", "/v1/exec", 405),
        ("GET", "/v2/anything", 404),
    ):
        r = await client.request(method, path)
        doc = await r.json()
        assert r.status == status and set(doc["error"]) == {"code", "message"}, (path, doc)


async def test_auth_is_checked_before_anything(client: TestClient) -> None:
    r = await client.get("/v1/status", headers={"Authorization": "Bearer not-it"})
    assert r.status == 401
    r = await client.get("/v1/status", headers={"Authorization": "Basic abc"})
    assert r.status == 401
    r = await client.get("/healthz", headers={"Authorization": ""})
    assert r.status == 200


async def test_file_endpoints(client: TestClient, tmp_path: Path) -> None:
    target = tmp_path / "w" / "f.txt"
    r = await client.put(f"/v1/files?path={target}&mkdirs=true", data=b"one")
    assert r.status == 201
    r = await client.get(f"/v1/files?path={target}")
    assert await r.read() == b"one"
    r = await client.delete(f"/v1/files?path={target}")
    assert r.status == 200 and not target.exists()
    r = await client.delete(f"/v1/files?path={target}")
    assert r.status == 404
    r = await client.put(f"/v1/files?path={tmp_path}/d/x", data=b"evil")
    assert r.status == 403 and (await r.json())["error"]["code"] == "path_protected"
    r = await client.put(f"/v1/files?path={target}&mode=999", data=b"x")
    assert r.status == 400
    r = await client.get(f"/v1/files/list?path={tmp_path / 'w'}")
    assert [e["name"] for e in (await r.json())["entries"]] == []


async def test_status_without_workspace(client: TestClient) -> None:
    r = await client.get("/v1/status")
    doc = await r.json()
    assert r.status == 200 and doc["workspace"] is None and doc["command"] is None


async def test_token_header_alternative(client: TestClient) -> None:
    # Through the apiserver's pods/proxy, Authorization is consumed by the apiserver.
    r = await client.get("/v1/status", headers={"Authorization": "", "X-Sandman-Token": TOKEN})
    assert r.status == 200
    r = await client.get("/v1/status", headers={"Authorization": "", "X-Sandman-Token": "no"})
    assert r.status == 401
