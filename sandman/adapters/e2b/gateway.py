"""The E2B gateway's state and app factory: E2B sandboxes are Sandman sandboxes.

E2B's published SDK, pointed here by environment variables alone::

    E2B_API_URL=http://127.0.0.1:49982 E2B_SANDBOX_URL=http://127.0.0.1:49982 \\
    E2B_API_KEY=<the gateway's key> python my_e2b_harness.py

One port serves E2B's control plane (``/v2/sandboxes``, ``/sandboxes/{id}``:
``api.py``) and every sandbox's envd (Connect RPC ``/process.Process/*`` and
``/filesystem.Filesystem/*``, ``/files``, ``/health``: ``envd.py``), routed
by the ``E2b-Sandbox-Id`` header the SDK sends with each envd request.

A sandbox id is the pod's name; the gateway acts only on pods labelled
``sandman.dev/e2b=true`` in its namespace, and keeps no state a restart
would lose except the handles of running commands (docs/adapters.md).

Anyone who reaches the port may send anything, so every route checks its
credential from the headers before it reads a byte of the body (only
``/health`` without a sandbox id answers without one), and a request refused
before its body was read has its connection closed rather than drained.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from sandman.adapters.e2b.connect import MAX_MESSAGE_BYTES, ConnectError
from sandman.adapters.e2b.processes import ProcessTable
from sandman.client import DaemonError, Sandbox, SandboxGone, SandboxStartError, SandmanClient
from sandman.contract import LABEL_E2B, labels

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

API_KEY_HEADER = "X-API-KEY"
ACCESS_TOKEN_HEADER = "X-Access-Token"
SANDBOX_ID_HEADER = "E2b-Sandbox-Id"
# Where relative paths and commands without a cwd start when the image's
# HOME cannot be read (envd's default is its user's home).
FALLBACK_HOME = "/"
# A pod name (a DNS subdomain): what an E2B sandbox id must be here.
POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
# One file upload (``POST /files``), counted after the one decoding its
# Content-Encoding asks for. Uploads are held whole before they go to the
# daemon (the SDK's write_file takes bytes), so this bounds the gateway's
# memory per upload; larger files go with the SDK's upload_tar.
MAX_UPLOAD_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class GatewayConfig:
    namespace: str
    api_key: str
    templates: Mapping[str, str] = field(default_factory=dict)  # E2B template id -> image
    node_selector: Mapping[str, str] | None = None
    resources: Mapping[str, Any] | None = None
    startup_timeout_s: float = 300.0
    max_upload_bytes: int = MAX_UPLOAD_BYTES

    def image_for(self, template: str) -> str:
        """The image of an E2B template: a mapped name, else the id itself if it
        looks like an image reference (has a ``/``)."""
        if template in self.templates:
            return self.templates[template]
        if "/" in template:
            return template
        known = ", ".join(sorted(self.templates)) or "none"
        raise ValueError(
            f"unknown template {template!r} (known: {known}); map it with "
            f"--template {template}=IMAGE or pass an image reference as the template"
        )


@dataclass
class Entry:
    """A sandbox the gateway has seen, with the commands it started in it."""

    sandbox: Sandbox
    processes: ProcessTable = field(default_factory=ProcessTable)
    home: str | None = None


class Gateway:
    """Sandbox ids to Sandman sandboxes, and the gateway's credentials.

    The failure it prevents: two requests for one unseen sandbox racing to
    attach it, each with its own process table, so that a command started
    through one is invisible to the other (not listed, not killable); the
    first attach to finish wins and the other reuses its entry. Event-loop
    only (all state lives in one aiohttp app).
    """

    def __init__(self, config: GatewayConfig, client: SandmanClient) -> None:
        if not config.api_key:
            # Every request without X-API-KEY would match an empty key.
            raise ValueError("the gateway needs a non-empty API key")
        self.config = config
        self.client = client
        self._entries: dict[str, Entry] = {}
        self._key = config.api_key.encode()

    # -- credentials -----------------------------------------------------------------
    def access_token(self, sandbox_id: str) -> str:
        """The envd access token of a sandbox: derived, so a restarted gateway agrees."""
        return hmac.new(self._key, b"envd:" + sandbox_id.encode(), hashlib.sha256).hexdigest()

    def api_key_ok(self, headers: Mapping[str, str]) -> bool:
        return hmac.compare_digest(headers.get(API_KEY_HEADER, "").encode(), self._key)

    def authenticate_envd(self, request: web.Request) -> str:
        """``envd_sandbox`` of a request: its headers only, nothing read."""
        return self.envd_sandbox(request.headers)

    def envd_sandbox(self, headers: Mapping[str, str]) -> str:
        """The sandbox id of an envd request, its access token checked."""
        sid = headers.get(SANDBOX_ID_HEADER, "")
        if not sid:
            raise ConnectError("invalid_argument", f"missing {SANDBOX_ID_HEADER} header")
        token = headers.get(ACCESS_TOKEN_HEADER, "")
        if not hmac.compare_digest(token.encode(), self.access_token(sid).encode()):
            raise ConnectError("unauthenticated", f"bad or missing {ACCESS_TOKEN_HEADER}")
        return sid

    # -- sandboxes -------------------------------------------------------------------
    async def attach(self, sandbox_id: str) -> Sandbox:
        """A fresh handle on a gateway-made sandbox; SandboxGone if there is none."""
        if not POD_NAME.fullmatch(sandbox_id):  # never a path into another resource
            raise SandboxGone(f"sandbox {sandbox_id[:80]!r} not found")
        try:
            sb = await Sandbox.attach(self.client, sandbox_id, self.config.namespace)
        except SandboxStartError:  # a pod, but not a sandbox
            raise SandboxGone(f"sandbox {sandbox_id} not found") from None
        if labels(sb.pod).get(LABEL_E2B) != "true" or sb.pod["metadata"].get("deletionTimestamp"):
            raise SandboxGone(f"sandbox {sandbox_id} not found")
        return sb

    async def entry(self, sandbox_id: str) -> Entry:
        if sandbox_id in self._entries:
            return self._entries[sandbox_id]
        sb = await self.attach(sandbox_id)
        return self._entries.setdefault(sandbox_id, Entry(sb))

    def add(self, sb: Sandbox) -> Entry:
        return self._entries.setdefault(sb.name, Entry(sb))

    async def forget(self, sandbox_id: str) -> None:
        entry = self._entries.pop(sandbox_id, None)
        if entry is not None:
            await entry.processes.close()

    async def home(self, entry: Entry) -> str:
        """The image's HOME (read once per sandbox): envd's default directory."""
        if entry.home is None:
            try:
                r = await entry.sandbox.exec(["/bin/sh", "-c", 'printf %s "$HOME"'], timeout_s=30)
                home = r.stdout if r.exit_code == 0 and r.stdout.startswith("/") else ""
            except DaemonError:
                home = ""  # no /bin/sh in the image
            entry.home = home or FALLBACK_HOME
        return entry.home

    async def close(self) -> None:
        for sid in list(self._entries):
            await self.forget(sid)


GATEWAY = web.AppKey("gateway", Gateway)


@web.middleware
async def close_unread(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A request answered before its body was read (refused: no credential,
    too large) gets its connection closed after the answer. Otherwise aiohttp
    would read and discard the rest of the body for up to 10 s to keep the
    connection alive, for anyone who sends one."""
    try:
        resp = await handler(request)
    except web.HTTPException as e:  # no such route (404, 405), raised by aiohttp's router
        resp = web.Response(status=e.status, text=e.text, headers=e.headers)
    if request.body_exists and not request.content.is_eof():
        resp.force_close()  # Connection: close
        if not resp.prepared:
            await resp.prepare(request)
        await resp.write_eof()
        request.protocol.force_close()  # what was written is flushed, then closed
    return resp


def create_app(config: GatewayConfig, client: SandmanClient) -> web.Application:
    """The gateway's app; ``client`` must be open and outlive the app."""
    from sandman.adapters.e2b import api, envd

    # What ``request.read()``/``json()`` may hold (counted as it arrives,
    # chunked or not): a control-plane document or an RPC message. Uploads
    # count against ``max_upload_bytes`` as they stream (envd.py).
    app = web.Application(client_max_size=MAX_MESSAGE_BYTES, middlewares=[close_unread])
    gateway = Gateway(config, client)
    app[GATEWAY] = gateway

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        yield
        await gateway.close()

    app.cleanup_ctx.append(lifecycle)
    app.add_routes(api.routes())
    app.add_routes(envd.routes())
    return app


async def run_gateway(
    config: GatewayConfig,
    *,
    host: str,
    port: int,
    kubeconfig: str | None,
    transport: str,
    context: str | None = None,
    on_listening: Callable[[list[tuple[str, int]]], None] | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT (``sandman e2b-gateway``); ``on_listening``
    hears the addresses really bound (port 0: the kernel's pick)."""
    from sandman.serving import serve_app

    async with SandmanClient(
        kubeconfig=kubeconfig, context=context, namespace=config.namespace, transport=transport
    ) as client:
        app = create_app(config, client)
        log.info("E2B gateway for namespace %s", config.namespace)
        return await serve_app(app, host=host, port=port, on_listening=on_listening)
