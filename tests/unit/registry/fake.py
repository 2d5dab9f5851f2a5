"""A small OCI registry for unit tests: the distribution API's read half, with auth.

The machine reaches no public registry, so the auth flows those use (Basic,
and the Bearer token challenge with a separate token service) are played by
this server on loopback; the real registry on the real node (anonymous) is
exercised by the e2e tests.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from sandman.oci import DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class FakeRegistry:
    auth: str = "none"  # none | basic | bearer
    user: str = "alice"
    password: str = "s3cret"
    delay_s: float = 0.0
    blobs: dict[str, bytes] = field(default_factory=dict)
    manifests: dict[tuple[str, str], tuple[str, bytes]] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    tokens_issued: int = 0
    head_digest: bool = True  # send Docker-Content-Digest on HEAD
    # Hostile or unusual registries: where to redirect manifest or blob GETs
    # (a base URL the path is appended to), the token realm to name, and a
    # fixed answer (status, body) for every manifest request.
    manifest_redirect: str = ""
    blob_redirect: str = ""
    realm: str = ""
    manifest_answer: tuple[int, bytes] | None = None
    token_answer: bytes = b""
    bind: str = "127.0.0.1"
    server: TestServer | None = None

    # -- content ---------------------------------------------------------------
    def add_image(
        self,
        repo: str,
        tag: str,
        config: dict[str, Any],
        *,
        media_type: str = OCI_MANIFEST,
        arch: str = "amd64",
    ) -> str:
        blob = json.dumps({"architecture": arch, "os": "linux", "config": config}).encode()
        self.blobs[digest_of(blob)] = blob
        manifest = {
            "schemaVersion": 2,
            "mediaType": media_type,
            "config": {"mediaType": "x", "digest": digest_of(blob), "size": len(blob)},
            "layers": [],
        }
        return self.put_manifest(repo, tag, media_type, manifest)

    def put_manifest(self, repo: str, tag: str, media_type: str, doc: dict[str, Any]) -> str:
        body = json.dumps(doc).encode()
        d = digest_of(body)
        self.manifests[(repo, d)] = (media_type, body)
        if tag:
            self.manifests[(repo, tag)] = (media_type, body)
        return d

    def add_index(self, repo: str, tag: str, entries: list[tuple[str, dict[str, str]]]) -> str:
        manifests = [
            {"mediaType": DOCKER_MANIFEST, "digest": d, "size": 1, "platform": p}
            for d, p in entries
        ]
        doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
        return self.put_manifest(repo, tag, OCI_INDEX, doc)

    # -- serving --------------------------------------------------------------------
    @property
    def host(self) -> str:
        assert self.server is not None
        return f"{self.bind}:{self.server.port}"

    async def __aenter__(self) -> FakeRegistry:
        app = web.Application()
        app.router.add_route("*", "/v2/{repo:.+}/manifests/{ref}", self._manifest)
        app.router.add_get("/v2/{repo:.+}/blobs/{digest}", self._blob)
        app.router.add_get("/token", self._token)
        self.server = TestServer(app, host=self.bind)
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        await self.server.close()

    def _count(self, what: str) -> None:
        self.hits[what] = self.hits.get(what, 0) + 1

    def _authorized(self, request: web.Request) -> web.Response | None:
        got = request.headers.get("Authorization", "")
        if self.auth == "none":
            return None
        if self.auth == "basic":
            want = "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            if got == want:
                return None
            return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="fake"'})
        if got == f"Bearer tok-{self.tokens_issued}" and self.tokens_issued:
            return None
        repo = request.match_info["repo"]
        realm = self.realm or f"http://{self.host}/token"
        challenge = f'Bearer realm="{realm}",service="fake",scope="repository:{repo}:pull"'
        return web.Response(status=401, headers={"WWW-Authenticate": challenge})

    async def _token(self, request: web.Request) -> web.Response:
        self._count("token")
        if self.token_answer:
            return web.Response(body=self.token_answer, content_type="application/json")
        want = "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        if request.headers.get("Authorization") != want:
            return web.Response(status=401)
        assert request.query["service"] == "fake" and request.query["scope"].endswith(":pull")
        self.tokens_issued += 1
        return web.json_response({"token": f"tok-{self.tokens_issued}", "expires_in": 300})

    async def _manifest(self, request: web.Request) -> web.StreamResponse:
        self._count("manifest-" + request.method)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        denied = self._authorized(request)
        if denied is not None:
            return denied
        if self.manifest_answer is not None:
            return web.Response(status=self.manifest_answer[0], body=self.manifest_answer[1])
        if self.manifest_redirect:
            raise web.HTTPFound(self.manifest_redirect + request.path)
        hit = self.manifests.get((request.match_info["repo"], request.match_info["ref"]))
        if hit is None:
            return web.json_response({"errors": [{"code": "MANIFEST_UNKNOWN"}]}, status=404)
        media_type, body = hit
        headers = {"Content-Type": media_type}
        if request.method == "HEAD":
            if self.head_digest:
                headers["Docker-Content-Digest"] = digest_of(body)
            return web.Response(status=200, headers=headers)
        return web.Response(
            body=body, headers={**headers, "Docker-Content-Digest": digest_of(body)}
        )

    async def _blob(self, request: web.Request) -> web.Response:
        self._count("blob")
        denied = self._authorized(request)
        if denied is not None:
            return denied
        if self.blob_redirect:
            raise web.HTTPTemporaryRedirect(self.blob_redirect + request.path)
        body = self.blobs.get(request.match_info["digest"])
        if body is None:
            return web.Response(status=404)
        return web.Response(body=body, content_type="application/octet-stream")


class Tarpit:
    """Accepts TCP connections on 127.0.0.2 and never answers: a registry that
    hangs. ``enough`` is set once ``want`` connections are held."""

    def __init__(self, want: int = 8) -> None:
        self.accepted = 0
        self.want = want
        self.enough = asyncio.Event()
        self._held: list[asyncio.StreamWriter] = []

    async def _serve(self, _r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._held.append(w)
        if self.accepted >= self.want:
            self.enough.set()

    async def __aenter__(self) -> Tarpit:
        self.server = await asyncio.start_server(self._serve, "127.0.0.2", 0)
        self.host = f"127.0.0.2:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        for w in self._held:
            w.close()
        self.server.close()
