"""A read-only registry client: an image reference to its digest and its config.

What the webhook (ENTRYPOINT/CMD of pods without ``command``) and the eval
runner (tags pinned to digests) need from the OCI distribution API, and
nothing more: ``resolve_digest`` and ``image_config`` (ENTRYPOINT, CMD,
WORKDIR, USER of the linux/amd64 image, through multi-arch indexes, as
Tekton's entrypoint lookup does). Authentication is what registries ask for:
anonymous, Basic, or the Bearer token challenge of the distribution token
spec, with credentials from a :class:`~sandman.registry_auth.Keychain`.

The pure parts (references, platform selection, config parsing) and the
exception tree live in ``sandman.oci`` and are re-exported here.

Every byte read is checked against the digest that named it.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlencode, urljoin

import aiohttp

from sandman.guarded_dns import RefusedAddressError, guarded_connector
from sandman.netguard import (
    REDIRECT_STATUSES,
    AddressRule,
    RefusedAddress,
    RegistryTimeout,
    host_port,
    realm_refusal,
    redirect_refusal,
    url_host_port,
)
from sandman.oci import (
    ACCEPT,
    DIGEST_RE,
    INDEX_TYPES,
    LINUX_AMD64,
    MANIFEST_TYPES,
    OCI_INDEX,
    OCI_MANIFEST,
    BadManifest,
    ConfigTooLarge,
    ImageConfig,
    ImageNotFound,
    InvalidReference,
    NoMatchingPlatform,
    Platform,
    Reference,
    RegistryError,
    RegistryUnreachable,
    ResolvedImage,
    Unauthorized,
    plain_http,
    select_manifest,
    sha256_digest,
)
from sandman.registry_auth import AuthConfigError, Credential, Keychain, parse_challenge

__all__ = [
    "LINUX_AMD64",
    "AuthConfigError",
    "BadManifest",
    "ConfigTooLarge",
    "Credential",
    "ImageConfig",
    "ImageNotFound",
    "InvalidReference",
    "Keychain",
    "NoMatchingPlatform",
    "Platform",
    "Reference",
    "RefusedAddress",
    "RegistryClient",
    "RegistryError",
    "RegistryTimeout",
    "RegistryUnreachable",
    "ResolvedImage",
    "Unauthorized",
]


# distribution (the reference registry) refuses manifests above 4 MiB, so no
# registry serves a bigger one. Caps keep a hostile registry from filling memory.
MAX_MANIFEST_BYTES = 4 << 20
# Image configs are a few KB (the harness's images: under 1 KB; big
# framework images with long `history`: tens of KB); 1 MiB is far above any
# real one and bounds what one lookup parses (json.loads of 1 MiB of short
# strings is a few tens of MB, briefly).
MAX_CONFIG_BYTES = 1 << 20
# An index may point at another index (OCI allows it); two levels is what
# real registries serve, deeper is a loop or an attack.
MAX_INDEX_DEPTH = 2
# The distribution token spec: "expires_in ... defaults to 60 seconds".
DEFAULT_TOKEN_S = 60.0
TOKEN_MARGIN_S = 5.0  # renew a little early: a token that expires in flight costs a retry
# One entry per (registry, repository, login); a webhook sees a few hundred
# repositories, 1,024 keeps every one warm at a few hundred KB.
MAX_TOKENS = 1024
# Per HTTP request when the caller sets no deadline of its own (the webhook
# always does: its whole lookup has a budget).
REQUEST_TIMEOUT_S = 10.0
# aiohttp's default pool (100 connections, no per-host bound) lets one slow
# registry hold every connection; 8 per host is more than one admission
# burst needs (lookups of one image share one fetch) and leaves the rest of
# the pool to other registries.
POOL_LIMIT = 100
POOL_LIMIT_PER_HOST = 8


def _as_ref(ref: str | Reference) -> Reference:
    return ref if isinstance(ref, Reference) else Reference.parse(ref)


# -- the client ------------------------------------------------------------------
class RegistryClient:
    """HTTP to registries, with a bearer-token cache.

    Exists so that a burst of lookups against one repository costs one token
    request, not one per lookup (Docker Hub rate-limits token requests too),
    and so that credentials go only where they were challenged for: a token
    is sent to the registry that asked for it, Basic only after a Basic
    challenge, and aiohttp drops ``Authorization`` on redirects to another
    host (blob storage). Safe for concurrent use by tasks of one event loop;
    not thread-safe. Close it (or use ``async with``) when done.
    """

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession | None = None,
        insecure: Iterable[str] = (),
        endpoints: Mapping[str, str] | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        user_agent: str = "sandman",
        guard: AddressRule | None = None,
        limit_per_host: int = POOL_LIMIT_PER_HOST,
    ) -> None:
        if guard is not None and session is not None:
            raise ValueError("a guarded client makes its own session (its connector checks)")
        self._session = session
        self._own_session = session is None
        self.insecure = frozenset(insecure)
        # Registry host -> base URL to reach it at (containerd's hosts.toml
        # `server`), e.g. a registry the node reaches on loopback and a pod
        # through the bridge: {"127.0.0.1:5000": "http://10.244.0.1:5000"}.
        self.endpoints = {k: v.rstrip("/") for k, v in (endpoints or {}).items()}
        self.request_timeout_s = request_timeout_s
        self.clock = clock
        self.user_agent = user_agent
        self._tokens: OrderedDict[tuple[str, str, str], tuple[str, float]] = OrderedDict()
        self.requests = 0  # HTTP requests made (tests and metrics)
        # With a guard (the webhook, reading registries pod authors name):
        # connections only where the rule allows, no redirect but a blob's,
        # tokens only from the registry's own host or one listed for it.
        self.guard = guard
        self.limit_per_host = limit_per_host

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
        self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = (
                guarded_connector(self.guard, limit=POOL_LIMIT, limit_per_host=self.limit_per_host)
                if self.guard is not None
                else aiohttp.TCPConnector(limit=POOL_LIMIT, limit_per_host=self.limit_per_host)
            )
            self._session = aiohttp.ClientSession(
                headers={"User-Agent": self.user_agent}, connector=connector
            )
            self._own_session = True
        return self._session

    def _hosts_of(self, ref: Reference) -> list[tuple[str, int]]:
        """Where ``ref``'s registry answers: its own host and the endpoint it is reached at."""
        base = url_host_port(self._base(ref))
        named = host_port(ref.api_host, base[1] if base else 443)
        return [named, base] if base is not None else [named]

    def _base(self, ref: Reference) -> str:
        if ref.domain in self.endpoints:
            return self.endpoints[ref.domain]
        scheme = "http" if plain_http(ref.domain, self.insecure) else "https"
        return f"{scheme}://{ref.api_host}"

    # -- public API ------------------------------------------------------------
    async def resolve_digest(
        self, ref: str | Reference, *, keychain: Keychain | None = None
    ) -> str:
        """The digest ``ref`` names right now (for a multi-arch image, its index's).

        A reference that already carries a digest is returned as is, without
        a request; ``ref@digest`` pulls exactly that content anyway.
        """
        r = _as_ref(ref)
        if r.digest:
            return r.digest
        status, headers, body = await self._call(
            r, "HEAD", f"/v2/{r.path}/manifests/{r.manifest_ref}", keychain, accept=ACCEPT
        )
        self._check_manifest_status(r, status, body)
        digest = headers.get("docker-content-digest", "")
        if DIGEST_RE.match(digest):
            return digest
        digest, _mt, _doc = await self._manifest(r, r.manifest_ref, keychain)
        return digest

    async def image_config(
        self,
        ref: str | Reference,
        *,
        keychain: Keychain | None = None,
        platform: Platform = LINUX_AMD64,
    ) -> ResolvedImage:
        """ENTRYPOINT, CMD, WORKDIR and USER of ``platform``'s image behind ``ref``."""
        r = _as_ref(ref)
        top, media_type, doc = await self._manifest(r, r.manifest_ref, keychain)
        digest = top
        for _ in range(MAX_INDEX_DEPTH):
            if media_type not in INDEX_TYPES:
                break
            chosen = select_manifest(doc, platform)
            digest = str(chosen.get("digest") or "")
            if not DIGEST_RE.match(digest):
                raise BadManifest(f"{r}: the index names {platform} by a bad digest {digest!r}")
            digest, media_type, doc = await self._manifest(r, digest, keychain)
        if media_type not in MANIFEST_TYPES:
            raise BadManifest(f"{r}: unsupported manifest type {media_type or '(none)'}")
        cfg_desc = doc.get("config")
        if not isinstance(cfg_desc, dict):
            raise BadManifest(f"{r}: the manifest has no config descriptor")
        cfg_digest = str(cfg_desc.get("digest") or "")
        if not DIGEST_RE.match(cfg_digest):
            raise BadManifest(f"{r}: the manifest has no config digest")
        size = cfg_desc.get("size")
        if isinstance(size, int) and size > MAX_CONFIG_BYTES:  # refused before the download
            raise ConfigTooLarge(
                f"{r}: the image config is {size} bytes, over the {MAX_CONFIG_BYTES} Sandman "
                "reads; give the container an explicit `command`"
            )
        blob = await self._blob(r, cfg_digest, keychain)
        try:
            cfg = ImageConfig.from_bytes(blob)
        except BadManifest as e:
            raise type(e)(f"{r}: {e}") from None
        return ResolvedImage(r, top, digest, cfg)

    # -- content ------------------------------------------------------------------
    def _check_manifest_status(self, r: Reference, status: int, body: bytes) -> None:
        if status == 404:
            raise ImageNotFound(f"{r}: no such image in {r.domain} (HTTP 404)")
        if status != 200:
            raise BadManifest(f"{r}: registry answered HTTP {status} {_short(body)}")

    async def _manifest(
        self, r: Reference, what: str, keychain: Keychain | None
    ) -> tuple[str, str, dict[str, Any]]:
        status, headers, body = await self._call(
            r,
            "GET",
            f"/v2/{r.path}/manifests/{what}",
            keychain,
            accept=ACCEPT,
            limit=MAX_MANIFEST_BYTES,
        )
        self._check_manifest_status(r, status, body)
        digest = sha256_digest(body)
        if what.startswith("sha256:") and digest != what:
            raise BadManifest(f"{r}: manifest {what} has content {digest} (digest mismatch)")
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            raise BadManifest(f"{r}: the manifest is not JSON (or nested too deep)") from None
        if not isinstance(doc, dict):
            raise BadManifest(f"{r}: the manifest is not a JSON object")
        # OCI manifests may omit mediaType; the Content-Type then says it.
        ctype = headers.get("content-type", "").split(";")[0].strip()
        media_type = str(doc.get("mediaType") or ctype)
        if media_type not in (*INDEX_TYPES, *MANIFEST_TYPES) and "manifests" in doc:
            media_type = OCI_INDEX
        elif media_type not in (*INDEX_TYPES, *MANIFEST_TYPES) and "config" in doc:
            media_type = OCI_MANIFEST
        if doc.get("schemaVersion") == 1:
            raise BadManifest(f"{r}: schema 1 manifests are not supported (re-push the image)")
        return digest, media_type, doc

    async def _blob(self, r: Reference, digest: str, keychain: Keychain | None) -> bytes:
        status, _h, body = await self._call(
            r, "GET", f"/v2/{r.path}/blobs/{digest}", keychain, limit=MAX_CONFIG_BYTES
        )
        if status == 404:
            raise ImageNotFound(f"{r}: config blob {digest} missing from {r.domain} (HTTP 404)")
        if status != 200:
            raise BadManifest(f"{r}: config blob: HTTP {status} {_short(body)}")
        if sha256_digest(body) != digest:
            raise BadManifest(f"{r}: config blob {digest} does not match its digest")
        return body

    # -- HTTP and auth ----------------------------------------------------------
    async def _call(
        self,
        r: Reference,
        method: str,
        path: str,
        keychain: Keychain | None,
        *,
        accept: str | None = None,
        limit: int = MAX_MANIFEST_BYTES,
    ) -> tuple[int, dict[str, str], bytes]:
        creds = keychain.lookup(r.domain, r.path) if keychain is not None else []
        cred = creds[0] if creds else None
        ident = cred.ident if cred else "anonymous"
        headers = {"Accept": accept} if accept else {}
        scope = f"repository:{r.path}:pull"
        token = self._cached_token(r.api_host, scope, ident)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        status, resp_headers, body = await self._send(method, self._base(r) + path, headers, limit)
        if status != 401:
            return self._denied(r, status, cred), resp_headers, body
        scheme, params = parse_challenge(resp_headers.get("www-authenticate", ""))
        if scheme == "bearer" and params.get("realm"):
            token = await self._fetch_token(r, params, scope, cred, ident)
            headers["Authorization"] = f"Bearer {token}"
        elif scheme == "basic" and cred is not None and cred.basic():
            headers["Authorization"] = cred.basic() or ""
        else:
            raise Unauthorized(_needs_login(r, cred))
        status, resp_headers, body = await self._send(method, self._base(r) + path, headers, limit)
        if status == 401:
            raise Unauthorized(_needs_login(r, cred))
        return self._denied(r, status, cred), resp_headers, body

    def _denied(self, r: Reference, status: int, cred: Credential | None) -> int:
        if status == 403:
            raise Unauthorized(_needs_login(r, cred))
        if status == 429:
            raise RegistryUnreachable(f"{r.domain} is rate-limiting us (HTTP 429)")
        if status >= 500:
            raise RegistryUnreachable(f"{r.domain} failed (HTTP {status})")
        return status

    async def _send(
        self, method: str, url: str, headers: dict[str, str], limit: int
    ) -> tuple[int, dict[str, str], bytes]:
        """One request to a registry, following only the redirects the client allows."""
        first, hops = url, 0
        while True:
            status, resp_headers, body = await self._exchange(method, url, headers, None, limit)
            if status not in REDIRECT_STATUSES or "location" not in resp_headers:
                return status, resp_headers, body
            target = urljoin(url, resp_headers["location"])
            why = redirect_refusal(method, first, target, hops, strict=self.guard is not None)
            if why is not None:
                raise RefusedAddress(f"{self._checked(url)}: {why}")
            if url_host_port(target) != url_host_port(url):
                # credentials are for the registry, never for its storage
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            url, hops = target, hops + 1

    def _checked(self, url: str) -> str:
        """``url``'s host:port for messages, after the guard's check of an IP
        literal (aiohttp resolves no IP literal, so the resolver never sees it)."""
        where = url_host_port(url)
        if where is None:
            raise RefusedAddress(f"not an http(s) URL: {url[:100]}")
        if self.guard is not None:
            why = self.guard.refusal(where[0], where[1], where[0])
            if why is not None and why != "not an IP address":
                raise RefusedAddress(f"{where[0]}:{where[1]}: refused address ({why})")
        return f"{where[0]}:{where[1]}"

    async def _exchange(
        self, method: str, url: str, headers: dict[str, str], data: str | None, limit: int
    ) -> tuple[int, dict[str, str], bytes]:
        """One HTTP exchange, no redirects followed, the body read up to ``limit``."""
        host = self._checked(url)
        self.requests += 1
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        try:
            async with self._http().request(
                method, url, headers=headers, data=data, timeout=timeout, allow_redirects=False
            ) as resp:
                length = resp.content_length
                if length is not None and length > limit:
                    raise BadManifest(
                        f"{host}: a {length}-byte answer is over the {limit}-byte cap"
                    )
                body = bytearray()
                async for chunk in resp.content.iter_chunked(1 << 16):
                    body += chunk
                    if len(body) > limit:
                        raise BadManifest(f"{host}: an answer over the {limit}-byte cap")
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, bytes(body)
        except TimeoutError:
            raise RegistryTimeout(
                f"{host} did not answer within {self.request_timeout_s:g}s"
            ) from None
        except aiohttp.ClientConnectorError as e:
            if isinstance(e.os_error, RefusedAddressError):
                raise RefusedAddress(str(e.os_error)) from None
            raise RegistryUnreachable(f"{host} unreachable: {e}") from None
        except aiohttp.ClientError as e:
            raise RegistryUnreachable(f"{host} unreachable: {e}") from None

    def _cached_token(self, host: str, scope: str, ident: str) -> str | None:
        hit = self._tokens.get((host, scope, ident))
        if hit is None:
            return None
        token, expires = hit
        if self.clock() >= expires:
            del self._tokens[(host, scope, ident)]
            return None
        return token

    async def _fetch_token(
        self,
        r: Reference,
        challenge: dict[str, str],
        scope: str,
        cred: Credential | None,
        ident: str,
    ) -> str:
        if cred is not None and cred.registry_token:
            return cred.registry_token
        realm = challenge["realm"]
        realm_host = realm.split("/")[2] if "://" in realm else ""
        if not realm.startswith(("https://", "http://")):
            raise BadManifest(f"{r.domain}: bad token realm {realm!r}")
        if self.guard is not None:
            why = realm_refusal(realm, self._hosts_of(r), self.guard, r.api_host)
            if why is not None:
                raise RefusedAddress(f"{r.domain}: {why}")
        if (
            cred is not None
            and realm.startswith("http://")
            and not plain_http(realm_host, self.insecure)
        ):
            raise Unauthorized(f"{r.domain}: refusing to send credentials to {realm} (plain HTTP)")
        query = {"scope": challenge.get("scope") or scope}
        if challenge.get("service"):
            query["service"] = challenge["service"]
        headers: dict[str, str] = {}
        method, data = "GET", None
        if cred is not None and cred.identity_token:
            # docker's identitytoken is an OAuth2 refresh token (the token spec's POST form).
            method = "POST"
            data = urlencode(
                {
                    **query,
                    "grant_type": "refresh_token",
                    "refresh_token": cred.identity_token,
                    "client_id": "sandman",
                }
            )
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        elif cred is not None and cred.basic():
            headers["Authorization"] = cred.basic() or ""
        url = realm if method == "POST" else f"{realm}?{urlencode(query)}"
        # No redirect: a token service answers where the registry said.
        status, _h, body = await self._exchange(method, url, headers, data, MAX_MANIFEST_BYTES)
        if status in (401, 403):
            raise Unauthorized(_needs_login(r, cred))
        if status >= 500 or status == 429:
            raise RegistryUnreachable(f"token service {realm}: HTTP {status}")
        try:
            doc = json.loads(body)
            token = str(doc.get("token") or doc.get("access_token") or "")
            expires_in = float(doc.get("expires_in") or DEFAULT_TOKEN_S)
        except (ValueError, AttributeError, TypeError, RecursionError):
            raise BadManifest(f"token service {realm}: not a token response") from None
        if status != 200 or not token:
            raise Unauthorized(f"{r.domain}: token service answered HTTP {status} without a token")
        key = (r.api_host, scope, ident)
        self._tokens[key] = (token, self.clock() + max(expires_in - TOKEN_MARGIN_S, 1.0))
        self._tokens.move_to_end(key)
        while len(self._tokens) > MAX_TOKENS:
            self._tokens.popitem(last=False)
        return token


def _needs_login(r: Reference, cred: Credential | None) -> str:
    if cred is None:
        return (
            f"{r.domain} requires credentials for {r.path} and none match it "
            "(add an imagePullSecret for this registry)"
        )
    return f"{r.domain} refused the credentials from {cred.source or 'the keychain'} for {r.path}"


def _short(body: bytes) -> str:
    return body[:200].decode(errors="replace").strip()
