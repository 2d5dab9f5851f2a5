"""Push images to an OCI distribution registry on loopback; run one that wants credentials.

Implements just the push half of the distribution API: HEAD a blob to skip
what the registry has, a monolithic upload (POST then PUT ?digest=) for what
it lacks, then PUT the manifest by tag. Plain HTTP by default (the local
cluster's registry); HTTPS with a CA file and HTTP basic auth when given.

:func:`serve` runs Debian's docker-registry (the CNCF distribution registry)
on loopback, by default as the local cluster runs it (plain HTTP, no auth),
or with htpasswd basic auth and a TLS certificate from the project's test CA:
the registry a user's `sandman image push` meets.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import socket
import ssl
import urllib.parse
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sandman.harness.images.oci import Blob, BlobStore, Image


class RegistryError(RuntimeError):
    pass


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass(frozen=True)
class Registry:
    host: str  # "127.0.0.1:5000"
    timeout_s: float = 300.0
    # HTTP basic auth (htpasswd registries), and HTTPS verified against this CA.
    username: str | None = None
    password: str | None = None
    ca_file: Path | None = None

    def _conn(self) -> http.client.HTTPConnection:
        host, port = self.host.rsplit(":", 1)
        if self.ca_file is not None:
            ctx = ssl.create_default_context(cafile=str(self.ca_file))
            return http.client.HTTPSConnection(host, int(port), timeout=self.timeout_s, context=ctx)
        return http.client.HTTPConnection(host, int(port), timeout=self.timeout_s)

    def _auth(self, headers: dict[str, str] | None) -> dict[str, str]:
        out = dict(headers or {})
        if self.username is not None:
            token = f"{self.username}:{self.password or ''}".encode()
            out["Authorization"] = "Basic " + base64.b64encode(token).decode()
        return out

    def _request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        stream_path: str | None = None,
        length: int | None = None,
    ) -> Response:
        conn = self._conn()
        try:
            headers = self._auth(headers)
            if stream_path is not None:
                hdrs = {**headers, "Content-Length": str(length)}
                with open(stream_path, "rb") as f:
                    conn.request(method, path, body=f, headers=hdrs)
                    resp = conn.getresponse()
            else:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
            data = resp.read()
            return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
        except OSError as e:
            raise RegistryError(f"registry {self.host} unreachable: {e}") from e
        finally:
            conn.close()

    def ping(self) -> bool:
        try:
            return self._request("GET", "/v2/").status == 200
        except RegistryError:
            return False

    def status(self) -> int | None:
        """``GET /v2/``'s status (401: up, wants credentials), None if nothing answers."""
        try:
            return self._request("GET", "/v2/").status
        except (RegistryError, ssl.SSLError):
            return None

    def has_blob(self, repo: str, digest: str) -> bool:
        return self._request("HEAD", f"/v2/{repo}/blobs/{digest}").status == 200

    def push_blob(self, repo: str, blob: Blob, store: BlobStore) -> bool:
        """Upload one blob unless present; True if it was uploaded."""
        if self.has_blob(repo, blob.digest):
            return False
        resp = self._request("POST", f"/v2/{repo}/blobs/uploads/")
        if resp.status != 202:
            raise RegistryError(f"start upload to {repo}: HTTP {resp.status}")
        location = resp.header("Location") or ""
        parsed = urllib.parse.urlsplit(location)
        query = urllib.parse.parse_qsl(parsed.query)
        query.append(("digest", blob.digest))
        put_path = f"{parsed.path}?{urllib.parse.urlencode(query)}"
        resp = self._request(
            "PUT",
            put_path,
            headers={"Content-Type": "application/octet-stream"},
            stream_path=str(store.path(blob.digest)),
            length=blob.size,
        )
        if resp.status != 201:
            raise RegistryError(f"upload {blob.digest} to {repo}: HTTP {resp.status}")
        return True

    def push(self, repo: str, tag: str, image: Image, store: BlobStore) -> int:
        """Push an image; returns the number of bytes actually uploaded."""
        uploaded = 0
        for blob in (*(layer.blob for layer in image.layers), image.config):
            if self.push_blob(repo, blob, store):
                uploaded += blob.size
        resp = self._request(
            "PUT",
            f"/v2/{repo}/manifests/{tag}",
            body=store.read(image.manifest.digest),
            headers={"Content-Type": image.manifest.media_type},
        )
        if resp.status != 201:
            body = resp.body.decode(errors="replace")
            raise RegistryError(f"put manifest {repo}:{tag}: HTTP {resp.status} {body}")
        return uploaded

    def manifest_digest(self, repo: str, tag: str) -> str | None:
        resp = self._request(
            "HEAD",
            f"/v2/{repo}/manifests/{tag}",
            headers={
                "Accept": "application/vnd.oci.image.manifest.v1+json, "
                "application/vnd.oci.image.index.v1+json"
            },
        )
        if resp.status != 200:
            return None
        return resp.header("Docker-Content-Digest")

    def tags(self, repo: str) -> list[str]:
        resp = self._request("GET", f"/v2/{repo}/tags/list")
        if resp.status != 200:
            return []
        return list(json.loads(resp.body).get("tags") or [])


# -- a registry to push to ---------------------------------------------------------
def htpasswd_line(username: str, password: str) -> str:
    """An htpasswd entry docker-registry accepts (bcrypt only; libcrypt makes it:
    the crypt module is deprecated, not gone, in 3.11)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

        return f"{username}:{crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))}\n"


def registry_config(
    addr: str,
    storage: Path,
    *,
    htpasswd: Path | None = None,
    tls: tuple[Path, Path] | None = None,
) -> dict[str, Any]:
    """docker-registry's config: plain HTTP without auth unless ``htpasswd``
    (basic auth) and ``tls`` (certificate, key) are given."""
    http_cfg: dict[str, Any] = {"addr": addr}
    if tls is not None:
        http_cfg["tls"] = {"certificate": str(tls[0]), "key": str(tls[1])}
    doc: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(storage)}},
        "http": http_cfg,
    }
    if htpasswd is not None:
        doc["auth"] = {"htpasswd": {"realm": "sandman", "path": str(htpasswd)}}
    return doc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(
    root: Path,
    *,
    username: str | None = None,
    password: str | None = None,
    tls: bool = False,
    timeout_s: float = 30.0,
) -> Iterator[Registry]:
    """A docker-registry on a free loopback port, state under ``root``, stopped
    on exit. With ``username`` it wants those credentials (htpasswd basic auth);
    with ``tls`` it serves HTTPS with a certificate of the CA at ``root/pki``.
    Yields a client holding the credentials and the CA."""
    import datetime as dt

    from sandman.harness.cluster.pki import Pki
    from sandman.harness.cluster.process import ManagedProcess, wait_until

    root.mkdir(parents=True, exist_ok=True)
    host = f"127.0.0.1:{_free_port()}"
    htpasswd = None
    if username is not None:
        htpasswd = root / "htpasswd"
        htpasswd.write_text(htpasswd_line(username, password or ""))
    cert = ca = None
    if tls:
        pki = Pki(root / "pki")
        pki.ensure_cert("registry", "registry", now=dt.datetime.now(dt.UTC),
                        dns=("localhost",), ips=("127.0.0.1",), server=True)  # fmt: skip
        cert, ca = (pki.crt("registry"), pki.key("registry")), pki.ca
    config = root / "config.yml"
    config.write_text(
        yaml.safe_dump(registry_config(host, root / "data", htpasswd=htpasswd, tls=cert))
    )
    proc = ManagedProcess(
        "registry",
        ("docker-registry", "serve", str(config)),
        root / "run",
        root / "logs",
        stop_timeout_s=5,
    )
    client = Registry(host, username=username, password=password, ca_file=ca)
    anonymous = Registry(host, ca_file=ca)
    proc.start()
    try:
        want = 401 if username is not None else 200
        wait_until(proc, lambda: anonymous.status() == want, timeout_s=timeout_s, what="serving")
        yield client
    finally:
        proc.stop()
