"""A small asyncio Kubernetes client on aiohttp: the plumbing every controller shares.

Why not the official client for requests: its watches and lists materialise
every object as generated Python classes (slow at 10k pods) and it is
synchronous, which would push every call of our asyncio servers into threads.
This client speaks plain JSON, reuses one connection pool, and offers exactly
what Sandman's components need: get/list/create/patch/delete, watches that
resume from a resourceVersion, and errors that keep the API's Status.

Kubeconfig files are read by the official package's loader
(``kubernetes.config.kube_config``), so every kubeconfig kubectl accepts works
(KUBECONFIG lists, contexts, exec plugins, token files, relative paths,
tls-server-name); an in-cluster service account is read natively (three files;
the controller image leaves the official package out).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import yaml

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# How often a changing token is looked at again between requests: an exec
# plugin's token is renewed by the official loader once within 5 minutes of
# its expirationTimestamp, a service-account token file is rotated by the
# kubelet at 80% of its (>= 10 minute) lifetime; a 401 renews at once.
TOKEN_RECHECK_S = 10.0
# An answer of 429, or of 5xx with a Retry-After header, says the apiserver did
# not process the request (API Priority and Fairness rejecting a full queue,
# the max-inflight limit, a server shutting down): client-go's rest client
# waits the seconds Retry-After names and sends it again, for every verb. We
# do the same, for up to THROTTLE_BUDGET_S of waiting per request (client-go
# counts 10 tries; APF asks for 1 s at a time, so a budget in seconds says
# what a caller may really wait). A 429 without the header waits 1 s
# (RETRY_AFTER_DEFAULT_S); a huge value is capped (RETRY_AFTER_MAX_S) so one
# answer cannot stall a client for minutes.
THROTTLE_BUDGET_S = 120.0
RETRY_AFTER_DEFAULT_S = 1.0
RETRY_AFTER_MAX_S = 30.0
# "Retry-After: 0" still waits this long, so a server that keeps saying 0
# gets at most budget / 0.1 tries instead of a busy loop.
RETRY_AFTER_MIN_S = 0.1


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


class KubeconfigError(Exception):
    """No usable cluster configuration; the message names the file, context or
    plugin and what to do."""


class BearerSource:
    """An ``Authorization`` value that changes over time: an exec plugin's or
    auth provider's token (renewed before it expires and after a 401), a token
    file, an in-cluster service-account token (rotated by the kubelet).

    ``fetch(renew)`` gives the current header value (blocking: it may run a
    plugin or read a file); ``renew=True`` asks for a new credential because
    the last one was refused. Thread-safe, and usable from any event loop
    (the sync SDK runs its own): the blocking part runs in a worker thread,
    one fetch at a time.
    """

    def __init__(
        self,
        fetch: Callable[[bool], str | None],
        *,
        recheck_s: float = TOKEN_RECHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._recheck_s = recheck_s
        self._clock = clock
        self._lock = threading.Lock()
        self._value: str | None = None
        self._checked: float | None = None
        self.renewals = 0  # fetches with renew=True (after a 401), for tests and logs

    def cached(self) -> str | None:
        """The value if it was looked at within ``recheck_s``, else None."""
        if self._checked is None or self._clock() - self._checked >= self._recheck_s:
            return None
        return self._value

    def get(self, refused: str | None = None) -> str | None:
        """The current value (blocking). ``refused``: the value a request was
        just refused with; it is renewed unless another caller already did."""
        with self._lock:
            if refused is not None:
                if self._value != refused:
                    return self._value  # renewed meanwhile by a concurrent 401
                self.renewals += 1
            elif (value := self.cached()) is not None:
                return value
            self._value = self._fetch(refused is not None)
            self._checked = self._clock()
            return self._value

    async def header(self, refused: str | None = None) -> str | None:
        if refused is None and (value := self.cached()) is not None:
            return value
        return await asyncio.to_thread(self.get, refused)


@dataclass(frozen=True)
class Credentials:
    """Where the apiserver is and how to authenticate to it.

    ``token`` is a fixed bearer token; ``bearer`` one that changes (it wins).
    ``namespace`` is the context's namespace, kubectl's default for commands.
    ``tls_server_name`` (kubeconfig ``tls-server-name``) is the name the
    server's certificate must carry and the SNI sent, when it differs from the
    server URL's host; ``proxy`` is the kubeconfig's ``proxy-url``.
    """

    server: str
    ssl: ssl.SSLContext
    token: str | None = None
    namespace: str = "default"
    tls_server_name: str | None = None
    proxy: str | None = None
    bearer: BearerSource | None = None
    source: str = ""  # "kubeconfig FILES, context NAME" / "in-cluster": for messages


def load_incluster(
    sa_dir: Path = SA_DIR,
    environ: Mapping[str, str] = os.environ,
    clock: Callable[[], float] = time.monotonic,
) -> Credentials:
    """The pod's service account: host and port from the environment, the CA,
    token and namespace from the mounted files.

    Not the official package's ``load_incluster_config``: it reads the same
    three files, and the controller image leaves the official package out
    (126 MB of its 175); the token file is re-read as the kubelet rotates it.
    """
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeconfigError("not in a pod: KUBERNETES_SERVICE_HOST/PORT are not set")
    token_file, ca_file = sa_dir / "token", sa_dir / "ca.crt"
    for f in (token_file, ca_file):
        if not f.is_file():
            raise KubeconfigError(
                f"in-cluster config: {f} is missing (automountServiceAccountToken off?)"
            )
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    ns_file = sa_dir / "namespace"
    namespace = ns_file.read_text().strip() if ns_file.is_file() else "default"

    def fetch(renew: bool) -> str | None:
        token = token_file.read_text().strip()
        return f"Bearer {token}" if token else None

    return Credentials(
        f"https://{host}:{port}",
        ssl.create_default_context(cafile=str(ca_file)),
        namespace=namespace,
        bearer=BearerSource(fetch, clock=clock),
        source="in-cluster service account",
    )


def _official() -> Any:
    try:
        from kubernetes.config import kube_config
    except ImportError as e:
        raise KubeconfigError(
            f"reading a kubeconfig needs the kubernetes package ({e}): pip install sandman-k8s"
        ) from None
    return kube_config


def _first_current_context(merger: Any) -> str | None:
    # kubectl: "the first file to set current-context wins"; the official
    # merger keeps the last one, so it is picked here.
    for doc in merger.config_files.values():
        if doc.get("current-context"):
            return str(doc["current-context"])
    return None


class _LogCapture(logging.Handler):
    """The official loader logs an exec plugin's failure and goes on without
    credentials; the message is kept to fail with it instead."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def load_kubeconfig(
    paths: Path | str,
    context: str | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Credentials:
    """A kubeconfig read by the official ``kubernetes`` package's loader.

    ``paths`` may list several files (``:``-separated, as in KUBECONFIG), merged
    as kubectl does (the first file to name a cluster, user or context wins).
    Everything kubectl's loader reads works: exec plugins and auth providers
    (their token is renewed: ``Credentials.bearer``), token files, embedded or
    file certificates (relative paths against the file that names them),
    ``tls-server-name``, ``insecure-skip-tls-verify``, ``proxy-url``.
    """
    kube_config = _official()
    from kubernetes.client import Configuration

    spec = str(paths)
    existing = [p for p in spec.split(os.pathsep) if p and os.path.exists(os.path.expanduser(p))]
    if not existing:
        raise KubeconfigError(f"no kubeconfig file at {spec}")
    try:
        merger = kube_config.KubeConfigMerger(spec)
        # Merged entries are the loader's ConfigNodes; their .value is the plain dict.
        contexts = [getattr(c, "value", c) for c in merger.config.value.get("contexts") or []]
    except (OSError, AttributeError, yaml.YAMLError, kube_config.ConfigException) as e:
        raise KubeconfigError(f"kubeconfig {spec}: {e}") from None
    name = context or _first_current_context(merger)
    names = [c.get("name") for c in contexts or []]
    if not name:
        raise KubeconfigError(
            f"kubeconfig {spec} sets no current-context; choose one with --context "
            f"(contexts: {', '.join(map(str, names)) or 'none'})"
        )
    chosen = next((c for c in contexts or [] if c.get("name") == name), None)
    if chosen is None:
        raise KubeconfigError(
            f"context {name!r} is not in kubeconfig {spec} "
            f"(contexts: {', '.join(map(str, names)) or 'none'})"
        )
    source = f"kubeconfig {spec}, context {name}"
    # Embedded certificates and keys are written to files for the loader;
    # they go once the SSL context holds them.
    with tempfile.TemporaryDirectory(prefix="sandman-kubeconfig-") as tmp:

        def build() -> Any:
            cfg = Configuration()
            capture = _LogCapture()
            root = logging.getLogger()
            root.addHandler(capture)
            try:
                kube_config.load_kube_config(
                    config_file=spec,
                    context=name,
                    client_configuration=cfg,
                    persist_config=False,  # never rewrite the user's files
                    temp_file_path=tmp,
                )
            except kube_config.ConfigException as e:
                raise KubeconfigError(f"{source}: {e}") from None
            finally:
                root.removeHandler(capture)
            if capture.messages and not _has_credentials(cfg):
                raise KubeconfigError(f"{source}: no credentials: {'; '.join(capture.messages)}")
            return cfg

        cfg = build()
        sslctx = _ssl_context(cfg, source)
    if not cfg.host:
        raise KubeconfigError(f"{source}: the cluster has no server")

    state = {"cfg": cfg}
    bearer = None
    if "BearerToken" in cfg.api_key:

        def fetch(renew: bool) -> str | None:
            if renew:  # refused: run the plugin / read the token file again
                with tempfile.TemporaryDirectory(prefix="sandman-kubeconfig-") as tmp2:
                    fresh = Configuration()
                    kube_config.load_kube_config(
                        config_file=spec,
                        context=name,
                        client_configuration=fresh,
                        persist_config=False,
                        temp_file_path=tmp2,
                    )
                state["cfg"] = fresh
            # The loader's refresh hook renews an expiring exec/auth-provider token.
            value = state["cfg"].get_api_key_with_prefix("BearerToken")
            # A token file's newline is not part of the token (client-go trims it too).
            return str(value).strip() if value else None

        bearer = BearerSource(fetch, clock=clock)
        bearer.get()  # the token just loaded, cached (no second plugin run)
    return Credentials(
        cfg.host.rstrip("/"),
        sslctx,
        namespace=str((chosen.get("context") or {}).get("namespace") or "default"),
        tls_server_name=getattr(cfg, "tls_server_name", None) or None,
        proxy=cfg.proxy or None,
        bearer=bearer,
        source=source,
    )


def _has_credentials(cfg: Any) -> bool:
    return bool(cfg.api_key.get("BearerToken") or cfg.cert_file)


def _ssl_context(cfg: Any, source: str) -> ssl.SSLContext:
    try:
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    except (OSError, ssl.SSLError) as e:
        raise KubeconfigError(f"{source}: cannot load its certificates: {e}") from None
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def kubeconfig_paths(kubeconfig: Path | str | None, environ: Mapping[str, str]) -> str | None:
    """The files kubectl would read: ``--kubeconfig``, else $KUBECONFIG (a
    list), else ~/.kube/config if it exists; None: none (in-cluster?)."""
    if kubeconfig:
        return str(kubeconfig)
    if environ.get("KUBECONFIG"):
        listed = environ["KUBECONFIG"]
        if any(os.path.exists(os.path.expanduser(p)) for p in listed.split(os.pathsep) if p):
            return listed
        return None if environ.get("KUBERNETES_SERVICE_HOST") else listed
    home = Path(environ.get("HOME") or Path.home()) / ".kube" / "config"
    return str(home) if home.exists() else None


def load_credentials(
    kubeconfig: Path | str | None = None,
    context: str | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    clock: Callable[[], float] = time.monotonic,
) -> Credentials:
    """kubectl's choice: ``--kubeconfig``, else $KUBECONFIG, else
    ~/.kube/config, else the pod's service account (in-cluster)."""
    paths = kubeconfig_paths(kubeconfig, environ)
    if paths is not None:
        return load_kubeconfig(paths, context, clock=clock)
    if environ.get("KUBERNETES_SERVICE_HOST"):
        if context:
            raise KubeconfigError(f"--context {context}: there is no kubeconfig, only in-cluster")
        return load_incluster(environ=environ, clock=clock)
    raise KubeconfigError(
        "no kubeconfig: pass --kubeconfig, set KUBECONFIG, or write ~/.kube/config"
    )


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
        throttle_budget_s: float = THROTTLE_BUDGET_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.creds = creds
        self._session: aiohttp.ClientSession | None = None
        self._user_agent = user_agent
        self._max = max_connections
        self._timeout = qps_timeout_s
        self._throttle_budget_s = throttle_budget_s
        self._sleep = sleep
        # Requests by verb (GET/POST/...; "WATCH" for watch calls): what a
        # controller costs the apiserver, for metrics and benchmarks.
        self.requests: collections.Counter[str] = collections.Counter()
        # Answers that asked us to come back later (by status), and the
        # seconds waited for them: how often the apiserver pushed back.
        self.throttled: collections.Counter[int] = collections.Counter()
        self.throttled_wait_s = 0.0

    @classmethod
    def from_kubeconfig(
        cls, kubeconfig: Path | str | None, *, context: str | None = None, **kw: Any
    ) -> KubeClient:
        """From ``kubeconfig`` (None: kubectl's choice, see load_credentials)."""
        return cls(load_credentials(kubeconfig, context), **kw)

    async def __aenter__(self) -> KubeClient:
        self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def open(self) -> None:
        if self._session is None:
            headers = {"User-Agent": self._user_agent, "Accept": "application/json"}
            if self.creds.token and self.creds.bearer is None:
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
        """The underlying pool, for requests this client has no verb for (pods/proxy);
        pass ``**request_options()`` and ``headers=await auth_headers()``."""
        assert self._session is not None, "KubeClient not opened"
        return self._session

    def request_options(self) -> dict[str, Any]:
        """Per-request aiohttp options the kubeconfig asks for (tls-server-name, proxy-url)."""
        opts: dict[str, Any] = {}
        if self.creds.tls_server_name:
            opts["server_hostname"] = self.creds.tls_server_name
        if self.creds.proxy:
            opts["proxy"] = self.creds.proxy
        return opts

    async def auth_headers(self, refused: dict[str, str] | None = None) -> dict[str, str]:
        """The Authorization header for a request (a fixed token is a session
        default already). ``refused``: the headers a request got 401 with:
        renew the credential (run the exec plugin again, re-read the file)."""
        bearer = self.creds.bearer
        if bearer is None:
            return {}
        value = await bearer.header(refused.get("Authorization") if refused else None)
        return {"Authorization": value} if value else {}

    def _renewable(self, status: int, attempt: int) -> bool:
        return status == 401 and attempt == 0 and self.creds.bearer is not None

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
        data = None if body is None else json.dumps(body).encode()
        auth = await self.auth_headers()
        renewed = False
        waited = 0.0
        while True:
            headers = dict(auth)
            if data is not None:
                headers["Content-Type"] = content_type
            async with self._session.request(
                method,
                url,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout or self._timeout),
                **self.request_options(),
            ) as resp:
                payload = await resp.read()
                if self._renewable(resp.status, 1 if renewed else 0):
                    # An expired exec-plugin or rotated token: renew, retry once
                    # (a 401 means the request was not processed).
                    auth = await self.auth_headers(refused=auth)
                    renewed = True
                    continue
                wait = retry_after(resp.status, resp.headers.get("Retry-After"))
                if wait is None or waited + wait > self._throttle_budget_s:
                    doc = json.loads(payload) if payload else None
                    if resp.status >= 400:
                        raise ApiError(resp.status, doc if doc is not None else payload.decode())
                    return doc
                self.throttled[resp.status] += 1
            # Not processed: wait as asked (the connection is back in the pool)
            # and send the same request again.
            waited += wait
            self.throttled_wait_s += wait
            await self._sleep(wait)

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
        auth = await self.auth_headers()
        resp = await self._session.get(
            url,
            headers=auth,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_s + 30),
            **self.request_options(),
        )
        if self._renewable(resp.status, 0):
            resp.release()
            resp = await self._session.get(
                url,
                headers=await self.auth_headers(refused=auth),
                timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_s + 30),
                **self.request_options(),
            )
        async with resp:
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


def retry_after(status: int, header: str | None) -> float | None:
    """Seconds to wait before sending a request again, or None: do not.

    As client-go's ``checkWait``: a 429, or a 5xx that carries Retry-After
    (the server's word that it did not process the request). The header's
    delay-seconds form only (the apiserver never sends a date).
    """
    if status != 429 and not (status >= 500 and header is not None):
        return None
    if header is None:
        return RETRY_AFTER_DEFAULT_S
    try:
        seconds = float(header.strip())
    except ValueError:
        return RETRY_AFTER_DEFAULT_S if status == 429 else None
    if seconds != seconds or seconds < 0:  # NaN or negative
        return RETRY_AFTER_DEFAULT_S if status == 429 else None
    return min(max(seconds, RETRY_AFTER_MIN_S), RETRY_AFTER_MAX_S)


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


async def list_pages(
    client: KubeClient,
    res: Resource,
    namespace: str | None = None,
    page: int = 500,
    **params: Any,
) -> AsyncIterator[tuple[list[dict[str, Any]], str | None]]:
    """One list, page by page: (items, None) for each page but the last, whose
    second element is the list's resourceVersion (to start a watch from). A
    caller that keeps less than whole objects never holds more than a page."""
    cont = None
    while True:
        doc = await client.list(res, namespace, limit=page, continue_=cont, **params)
        cont = doc["metadata"].get("continue")
        if not cont:
            yield doc.get("items", []), doc["metadata"]["resourceVersion"]
            return
        yield doc.get("items", []), None


async def list_all(
    client: KubeClient,
    res: Resource,
    namespace: str | None = None,
    page: int = 500,
    **params: Any,
) -> tuple[list[dict[str, Any]], str]:
    """Every object (paged) and the list's resourceVersion, to start a watch from."""
    items: list[dict[str, Any]] = []
    rv = ""
    async for chunk, last_rv in list_pages(client, res, namespace, page, **params):
        items += chunk
        rv = last_rv or rv
    return items, rv


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
