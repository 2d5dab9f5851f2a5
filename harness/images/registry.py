"""Push images to an OCI distribution registry (plain HTTP, loopback).

Implements just the push half of the distribution API: HEAD a blob to skip
what the registry has, a monolithic upload (POST then PUT ?digest=) for what
it lacks, then PUT the manifest by tag.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from dataclasses import dataclass

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

    def _conn(self) -> http.client.HTTPConnection:
        host, port = self.host.rsplit(":", 1)
        return http.client.HTTPConnection(host, int(port), timeout=self.timeout_s)

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
            if stream_path is not None:
                hdrs = {**(headers or {}), "Content-Length": str(length)}
                with open(stream_path, "rb") as f:
                    conn.request(method, path, body=f, headers=hdrs)
                    resp = conn.getresponse()
            else:
                conn.request(method, path, body=body, headers=headers or {})
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
            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        )
        if resp.status != 200:
            return None
        return resp.header("Docker-Content-Digest")

    def tags(self, repo: str) -> list[str]:
        resp = self._request("GET", f"/v2/{repo}/tags/list")
        if resp.status != 200:
            return []
        return list(json.loads(resp.body).get("tags") or [])
