"""A small asyncio Kubernetes client on aiohttp: the plumbing every controller shares.

Why not the official client: its watches and lists materialise every object
as generated Python classes (slow at 10k pods) and it is synchronous, which
would push every call of our asyncio servers into threads. This client speaks
plain JSON, reuses one connection pool, and offers exactly what Sandman's
components need: get/list/create/patch/delete, watches that resume from a
resourceVersion, and errors that keep the API's Status.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import yaml

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ApiError(Exception):
    """A non-2xx answer; ``status`` is the HTTP code, ``reason`` the Status reason."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body if isinstance(body, dict) else {"message": str(body)}
        self.reason = self.body.get("reason", "")
        super().__init__(f"HTTP {status} {self.reason}: {self.body.get('message', '')}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


@dataclass(frozen=True)
class Credentials:
    server: str
    ssl: ssl.SSLContext
    token: str | None = None


def _b64_to_file(data: str, tmpdir: str, name: str) -> str:
    path = os.path.join(tmpdir, name)
    with open(path, "wb") as f:
        f.write(base64.b64decode(data))
    return path


def load_kubeconfig(path: Path | str, context: str | None = None) -> Credentials:
    """Client certs, bearer tokens and CA from a kubeconfig (embedded or files)."""
    doc = yaml.safe_load(Path(path).read_text())
    ctx_name = context or doc.get("current-context")
    ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
    user = next(u["user"] for u in doc["users"] if u["name"] == ctx["user"])
    sslctx = ssl.create_default_context()
    with tempfile.TemporaryDirectory() as tmp:
        if "certificate-authority-data" in cluster:
            sslctx.load_verify_locations(
                cafile=_b64_to_file(cluster["certificate-authority-data"], tmp, "ca")
            )
        elif "certificate-authority" in cluster:
            sslctx.load_verify_locations(cafile=cluster["certificate-authority"])
        if cluster.get("insecure-skip-tls-verify"):
            sslctx.check_hostname = False
            sslctx.verify_mode = ssl.CERT_NONE
        if "client-certificate-data" in user:
            sslctx.load_cert_chain(
                _b64_to_file(user["client-certificate-data"], tmp, "crt"),
                _b64_to_file(user["client-key-data"], tmp, "key"),
            )
        elif "client-certificate" in user:
            sslctx.load_cert_chain(user["client-certificate"], user["client-key"])
    return Credentials(cluster["server"].rstrip("/"), sslctx, user.get("token"))


def load_incluster() -> Credentials:
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    sslctx = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))
    return Credentials(f"https://{host}:{port}", sslctx, None)


def load_credentials(kubeconfig: Path | str | None) -> Credentials:
    if kubeconfig:
        return load_kubeconfig(kubeconfig)
    if os.environ.get("KUBECONFIG"):
        return load_kubeconfig(os.environ["KUBECONFIG"].split(":")[0])
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return load_incluster()
    return load_kubeconfig(Path.home() / ".kube" / "config")


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the API: ``Resource("", "v1", "pods")``."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name)}"
        return base


PODS = Resource("", "v1", "pods")
EVENTS = Resource("", "v1", "events")
SECRETS = Resource("", "v1", "secrets")
CONFIGMAPS = Resource("", "v1", "configmaps")
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
NODES = Resource("", "v1", "nodes", namespaced=False)
LEASES = Resource("coordination.k8s.io", "v1", "leases")
REPLICASETS = Resource("apps", "v1", "replicasets")
MUTATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", namespaced=False
)
VALIDATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", namespaced=False
)

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


class KubeClient:
    """One connection pool to the apiserver. Use as an async context manager.

    Safe for concurrent use by many tasks of one event loop.
    """

    def __init__(
        self,
        creds: Credentials,
        *,
        user_agent: str = "sandman",
        max_connections: int = 64,
        qps_timeout_s: float = 30.0,
    ) -> None:
        self.creds = creds
        self._session: aiohttp.ClientSession | None = None
        self._user_agent = user_agent
        self._max = max_connections
        self._timeout = qps_timeout_s
        # Requests by verb (GET/POST/...; "WATCH" for watch calls): what a
        # controller costs the apiserver, for metrics and benchmarks.
        self.requests: collections.Counter[str] = collections.Counter()

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path | str | None, **kw: Any) -> KubeClient:
        return cls(load_credentials(kubeconfig), **kw)

    async def __aenter__(self) -> KubeClient:
        self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def open(self) -> None:
        if self._session is None:
            headers = {"User-Agent": self._user_agent, "Accept": "application/json"}
            if self.creds.token:
                headers["Authorization"] = f"Bearer {self.creds.token}"
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.creds.ssl, limit=self._max),
                headers=headers,
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def session(self) -> aiohttp.ClientSession:
        """The underlying pool, for requests this client has no verb for (pods/proxy)."""
        assert self._session is not None, "KubeClient not opened"
        return self._session

    def auth_headers(self) -> dict[str, str]:
        return self._token_header()

    def _token_header(self) -> dict[str, str]:
        # In-cluster tokens rotate (bound tokens, ~1 h): read at each request.
        if self.creds.token is None and (SA_DIR / "token").exists():
            return {"Authorization": f"Bearer {(SA_DIR / 'token').read_text().strip()}"}
        return {}

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        assert self._session is not None, "KubeClient not opened"
        self.requests[method] += 1
        url = self.creds.server + path
        if params:
            url += "?" + urlencode({k: v for k, v in params.items() if v is not None})
        headers = self._token_header()
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        async with self._session.request(
            method,
            url,
            data=data,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout or self._timeout),
        ) as resp:
            payload = await resp.read()
            doc = json.loads(payload) if payload else None
            if resp.status >= 400:
                raise ApiError(resp.status, doc if doc is not None else payload.decode())
            return doc

    # -- verbs ----------------------------------------------------------------
    async def get(self, res: Resource, name: str, namespace: str | None = None) -> Any:
        return await self.request("GET", res.path(namespace, name))

    async def list(
        self, res: Resource, namespace: str | None = None, **params: Any
    ) -> dict[str, Any]:
        return await self.request("GET", res.path(namespace), params=_params(params))

    async def create(
        self, res: Resource, obj: Any, namespace: str | None = None, **params: Any
    ) -> Any:
        return await self.request("POST", res.path(namespace), body=obj, params=_params(params))

    async def replace(
        self, res: Resource, name: str, obj: Any, namespace: str | None = None
    ) -> Any:
        return await self.request("PUT", res.path(namespace, name), body=obj)

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        content_type: str = JSON_PATCH,
        **params: Any,
    ) -> Any:
        return await self.request(
            "PATCH",
            res.path(namespace, name),
            body=patch,
            content_type=content_type,
            params=_params(params),
        )

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        grace_period_s: int | None = None,
        **params: Any,
    ) -> Any:
        """DELETE with optional UID / resourceVersion preconditions (409 if they fail)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        pre = {}
        if uid:
            pre["uid"] = uid
        if resource_version:
            pre["resourceVersion"] = resource_version
        if pre:
            body["preconditions"] = pre
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        return await self.request(
            "DELETE", res.path(namespace, name), body=body, params=_params(params)
        )

    async def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str,
        timeout_s: int = 300,
        **params: Any,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Yield (type, object) from one watch request, bookmarks included.

        Raises WatchExpired on 410; the caller lists again and resumes.
        """
        assert self._session is not None
        self.requests["WATCH"] += 1
        q = _params(params) | {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        url = self.creds.server + res.path(namespace) + "?" + urlencode(q)
        async with self._session.get(
            url,
            headers=self._token_header(),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_s + 30),
        ) as resp:
            if resp.status == 410:
                raise WatchExpired()
            if resp.status >= 400:
                raise ApiError(resp.status, await resp.text())
            async for line in resp.content:
                if not line.strip():
                    continue
                ev = json.loads(line)
                if ev["type"] == "ERROR":
                    if ev["object"].get("code") == 410:
                        raise WatchExpired()
                    raise ApiError(ev["object"].get("code", 500), ev["object"])
                yield ev["type"], ev["object"]


def _params(params: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for k, v in params.items():
        if v is None:
            continue
        key = {
            "label_selector": "labelSelector",
            "field_selector": "fieldSelector",
            "dry_run": "dryRun",
            "field_manager": "fieldManager",
            "resource_version": "resourceVersion",
            "limit": "limit",
            "continue_": "continue",
            "propagation_policy": "propagationPolicy",
        }.get(k, k)
        out[key] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


async def list_all(
    client: KubeClient,
    res: Resource,
    namespace: str | None = None,
    page: int = 500,
    **params: Any,
) -> tuple[list[dict[str, Any]], str]:
    """Every object (paged) and the list's resourceVersion, to start a watch from."""
    items: list[dict[str, Any]] = []
    cont = None
    while True:
        doc = await client.list(res, namespace, limit=page, continue_=cont, **params)
        items += doc.get("items", [])
        cont = doc["metadata"].get("continue")
        if not cont:
            return items, doc["metadata"]["resourceVersion"]


def escape_pointer(key: str) -> str:
    """A map key as a JSON-pointer segment (RFC 6901): `~` -> `~0`, `/` -> `~1`."""
    return key.replace("~", "~0").replace("/", "~1")


async def sleep_or(event: asyncio.Event, seconds: float) -> bool:
    """Sleep, or return early (True) when ``event`` is set."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
        return True
    except TimeoutError:
        return False
