"""Registry credentials: docker config files and pull secrets, matched as the kubelet does (pure).

A pod's ``imagePullSecrets`` (``kubernetes.io/dockerconfigjson`` or the legacy
``kubernetes.io/dockercfg``) and a user's ``~/.docker/config.json`` hold the
same map: registry key -> credential. The kubelet's keyring
(``pkg/credentialprovider/keyring.go``) decides which key applies to an image:
the key's host may use ``*`` per DNS label, its port must equal the image's,
and its path must be a prefix of the image's repository; more specific keys
first. Matching differently from the kubelet would make the webhook read an
image with other credentials than the node pulls it with, which is the
failure this module prevents.

Credential helpers (``credsStore``/``credHelpers``) are not run: the webhook
must never execute programs named by user data.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Docker Hub answers under several names; a key for any of them is a key for all.
DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
SECRET_DOCKERCONFIGJSON = "kubernetes.io/dockerconfigjson"
SECRET_DOCKERCFG = "kubernetes.io/dockercfg"


class AuthConfigError(ValueError):
    """A docker config or pull secret that cannot be read; the message says which and why."""


@dataclass(frozen=True)
class Credential:
    """One registry login. ``repr`` shows where it came from, never the secret."""

    username: str = field(default="", repr=False)
    password: str = field(default="", repr=False)
    identity_token: str = field(
        default="", repr=False
    )  # docker `identitytoken`: OAuth2 refresh token
    registry_token: str = field(default="", repr=False)  # docker `registrytoken`: a bearer token
    source: str = ""  # e.g. "secret ns/regcred", for messages

    @property
    def ident(self) -> str:
        """A stable, non-reversible name for cache keys (equal logins share entries)."""
        material = "\0".join(
            (self.username, self.password, self.identity_token, self.registry_token)
        )
        return hashlib.sha256(material.encode()).hexdigest()[:16]

    def basic(self) -> str | None:
        if not self.username and not self.password:
            return None
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode()


def _credential(entry: Any, source: str) -> Credential:
    if not isinstance(entry, Mapping):
        raise AuthConfigError(f"{source}: an auths entry is not a mapping")
    user, pw = str(entry.get("username") or ""), str(entry.get("password") or "")
    auth = entry.get("auth")
    if auth:
        try:
            decoded = base64.b64decode(str(auth), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise AuthConfigError(f"{source}: `auth` is not base64 of user:password") from None
        user, sep, pw = decoded.partition(":")
        if not sep:
            raise AuthConfigError(f"{source}: `auth` is not base64 of user:password")
    return Credential(
        username=user,
        password=pw,
        identity_token=str(entry.get("identitytoken") or ""),
        registry_token=str(entry.get("registrytoken") or ""),
        source=source,
    )


@dataclass(frozen=True)
class _Key:
    host: str  # may hold "*" labels
    port: str
    path: str  # repository prefix, "" for the whole registry
    credential: Credential


def _parse_key(key: str) -> tuple[str, str, str]:
    text = key.strip()
    for scheme in ("https://", "http://"):
        text = text.removeprefix(scheme)
    text = text.rstrip("/")
    for suffix in ("/v1", "/v2"):
        text = text.removesuffix(suffix)
    hostport, _, path = text.partition("/")
    host, _, port = hostport.partition(":")
    host = host.lower()
    if host in DOCKER_HUB_ALIASES:
        host = "docker.io"
    return host, port, path.strip("/")


def _host_matches(pattern: str, host: str) -> bool:
    p, h = pattern.split("."), host.split(".")
    return len(p) == len(h) and all(
        fnmatch.fnmatchcase(hl, pl) for pl, hl in zip(p, h, strict=True)
    )


class Keychain:
    """Credentials by registry key, looked up per image. Immutable; safe to share."""

    def __init__(self, keys: Sequence[_Key] = ()) -> None:
        self._keys = tuple(keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"Keychain({[k.credential.source for k in self._keys]})"

    @classmethod
    def from_docker_config(cls, doc: Any, *, source: str = "docker config") -> Keychain:
        """``{"auths": {key: entry}}`` (config.json) or ``{key: entry}`` (.dockercfg)."""
        if not isinstance(doc, Mapping):
            raise AuthConfigError(f"{source}: not a JSON object")
        auths = doc.get("auths", doc)
        if not isinstance(auths, Mapping):
            raise AuthConfigError(f"{source}: `auths` is not a mapping")
        keys = []
        for key, entry in auths.items():
            if key in ("credsStore", "credHelpers", "HttpHeaders", "psFormat", "detachKeys"):
                continue
            host, port, path = _parse_key(str(key))
            keys.append(_Key(host, port, path, _credential(entry, source)))
        return cls(keys)

    @classmethod
    def from_docker_config_file(cls, path: Path | None = None) -> Keychain:
        """``$DOCKER_CONFIG/config.json`` (default ``~/.docker``); empty when absent."""
        if path is None:
            base = os.environ.get("DOCKER_CONFIG") or str(Path.home() / ".docker")
            path = Path(base) / "config.json"
        try:
            text = path.read_text()
        except FileNotFoundError:
            return cls()
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise AuthConfigError(f"{path}: not JSON ({e})") from None
        return cls.from_docker_config(doc, source=str(path))

    @classmethod
    def from_secret(cls, secret: Mapping[str, Any]) -> Keychain:
        """A pull secret as the API returns it (``data`` values base64)."""
        md = secret.get("metadata") or {}
        source = f"secret {md.get('namespace', '')}/{md.get('name', '')}"
        kind = secret.get("type")
        key = {SECRET_DOCKERCONFIGJSON: ".dockerconfigjson", SECRET_DOCKERCFG: ".dockercfg"}.get(
            str(kind)
        )
        if key is None:
            raise AuthConfigError(
                f"{source}: type {kind!r} is not {SECRET_DOCKERCONFIGJSON} or {SECRET_DOCKERCFG}"
            )
        raw = (secret.get("data") or {}).get(key)
        if not raw:
            raise AuthConfigError(f"{source}: no {key} key")
        try:
            doc = json.loads(base64.b64decode(raw))
        except (binascii.Error, ValueError):
            raise AuthConfigError(f"{source}: {key} is not base64 of JSON") from None
        return cls.from_docker_config(doc, source=source)

    @classmethod
    def merge(cls, chains: Iterable[Keychain]) -> Keychain:
        """Several secrets in the pod's order; ties in specificity keep that order."""
        return cls([k for c in chains for k in c._keys])

    def lookup(self, domain: str, repository: str) -> list[Credential]:
        """Credentials for ``domain/repository``, most specific key first (the kubelet's order)."""
        host, _, port = domain.partition(":")
        host = "docker.io" if host.lower() in DOCKER_HUB_ALIASES else host.lower()
        found: list[tuple[int, int, Credential]] = []
        for i, k in enumerate(self._keys):
            if k.port != port or not _host_matches(k.host, host):
                continue
            if k.path and not (repository == k.path or repository.startswith(k.path + "/")):
                continue
            # Longer paths, then hosts without wildcards, are more specific.
            found.append((-(len(k.path) * 2 + ("*" not in k.host)), i, k.credential))
        return [c for _, _, c in sorted(found, key=lambda t: (t[0], t[1]))]


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``WWW-Authenticate: Bearer realm="...",service="...",scope="..."`` -> ("bearer", {...})."""
    scheme, _, rest = header.strip().partition(" ")
    params: dict[str, str] = {}
    i, n = 0, len(rest)
    while i < n:
        while i < n and rest[i] in " ,":
            i += 1
        eq = rest.find("=", i)
        if eq < 0:
            break
        name = rest[i:eq].strip().lower()
        i = eq + 1
        if i < n and rest[i] == '"':
            i += 1
            value = []
            while i < n and rest[i] != '"':
                if rest[i] == "\\" and i + 1 < n:
                    i += 1
                value.append(rest[i])
                i += 1
            i += 1  # closing quote
            params[name] = "".join(value)
        else:
            end = rest.find(",", i)
            end = n if end < 0 else end
            params[name] = rest[i:end].strip()
            i = end
    return scheme.lower(), params
