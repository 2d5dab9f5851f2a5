"""OCI image pieces without Docker: layers, config, manifest, blob store.

Layers are deterministic (sorted entries, fixed mtimes, gzip without a
timestamp), so the same rootfs always yields the same digest and a rebuild
does not force every node to pull again.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"

# Fixed mtime for every entry (2000-01-01): layer digests depend on content only.
EPOCH = 946684800

# Mount points a runtime fills in; their contents never belong in a layer.
RUNTIME_DIRS = ("dev", "proc", "sys", "run")


@dataclass(frozen=True)
class Blob:
    digest: str  # "sha256:<hex>" of the bytes as stored (compressed for layers)
    size: int
    media_type: str

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass(frozen=True)
class Layer:
    blob: Blob
    diff_id: str  # sha256 of the uncompressed tar, as the config's rootfs wants


@dataclass(frozen=True)
class ImageConfig:
    """The runtime half of an OCI image config."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    working_dir: str = "/"
    user: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    exposed_ports: tuple[str, ...] = ()
    # The platform the layers' binaries run on (platforms.py names them); a
    # runtime refuses, or a node pulls from an index, by these.
    architecture: str = "amd64"
    variant: str = ""

    def to_json(self, layers: Iterable[Layer]) -> dict[str, Any]:
        cfg: dict[str, Any] = {"Env": list(self.env), "WorkingDir": self.working_dir}
        if self.entrypoint:
            cfg["Entrypoint"] = list(self.entrypoint)
        if self.cmd:
            cfg["Cmd"] = list(self.cmd)
        if self.user:
            cfg["User"] = self.user
        if self.labels:
            cfg["Labels"] = dict(self.labels)
        if self.exposed_ports:
            cfg["ExposedPorts"] = {p: {} for p in self.exposed_ports}
        doc: dict[str, Any] = {
            "created": "2000-01-01T00:00:00Z",
            "architecture": self.architecture,
            "os": "linux",
            "config": cfg,
            "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
            "history": [{"created": "2000-01-01T00:00:00Z", "created_by": "sandman image build"}],
        }
        if self.variant:
            doc["variant"] = self.variant
        return doc


class BlobStore:
    """Content-addressed blobs on disk (``<root>/sha256/<hex>``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, digest: str) -> Path:
        algo, hexd = digest.split(":", 1)
        return self.root / algo / hexd

    def has(self, digest: str) -> bool:
        return self.path(digest).exists()

    def put_bytes(self, data: bytes, media_type: str) -> Blob:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        path = self.path(digest)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(data)
            tmp.replace(path)
        return Blob(digest, len(data), media_type)

    def put_file(self, src: Path, media_type: str) -> Blob:
        h = hashlib.sha256()
        with open(src, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        digest = "sha256:" + h.hexdigest()
        path = self.path(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            shutil.move(src, path)
        return Blob(digest, path.stat().st_size, media_type)

    def read(self, digest: str) -> bytes:
        return self.path(digest).read_bytes()


class _HashingWriter(io.RawIOBase):
    """Hashes the uncompressed tar stream on its way into gzip (the diff_id)."""

    def __init__(self, inner: gzip.GzipFile) -> None:
        self.inner = inner
        self.sha = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.sha.update(b)
        return self.inner.write(b)


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    top = info.name.split("/", 1)
    if len(top) == 2 and top[0] in RUNTIME_DIRS:
        return None  # keep /dev etc. as empty dirs, drop their contents
    info.mtime = EPOCH
    info.uname = info.gname = ""
    return info


def layer_from_dir(root: Path, store: BlobStore, *, level: int = 6) -> Layer:
    """Tar ``root``'s contents (as the image's /) into a gzip layer blob."""
    store.root.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=store.root, prefix="layer-", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with open(tmp, "wb") as raw:
            gz = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=level, mtime=0, filename="")
            hw = _HashingWriter(gz)
            with tarfile.open(fileobj=hw, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                for entry in sorted(os.listdir(root)):
                    tar.add(root / entry, arcname=entry, filter=_normalise)
            gz.close()
        diff_id = "sha256:" + hw.sha.hexdigest()
        blob = store.put_file(tmp, MEDIA_LAYER_GZIP)
        return Layer(blob, diff_id)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class Image:
    manifest: Blob
    config: Blob
    layers: tuple[Layer, ...]

    @property
    def size(self) -> int:
        """Bytes a node pulls: config plus compressed layers."""
        return self.config.size + sum(layer.blob.size for layer in self.layers)


def assemble(layers: list[Layer], config: ImageConfig, store: BlobStore) -> Image:
    cfg_blob = store.put_bytes(
        json.dumps(config.to_json(layers), sort_keys=True, separators=(",", ":")).encode(),
        MEDIA_CONFIG,
    )
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": cfg_blob.descriptor(),
        "layers": [layer.blob.descriptor() for layer in layers],
    }
    man_blob = store.put_bytes(
        json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode(), MEDIA_MANIFEST
    )
    return Image(man_blob, cfg_blob, tuple(layers))


@dataclass(frozen=True)
class ImageIndex:
    """One tag, several platforms: an OCI image index (a "manifest list")."""

    blob: Blob
    # (platform object, image) per entry, in the index's order.
    entries: tuple[tuple[dict[str, Any], Image], ...]

    @property
    def images(self) -> tuple[Image, ...]:
        return tuple(image for _, image in self.entries)


def index_json(entries: Iterable[tuple[dict[str, Any], Image]]) -> dict[str, Any]:
    """The index document: one manifest descriptor with its platform per entry (pure)."""
    manifests = []
    seen: set[tuple[str, ...]] = set()
    for platform, image in entries:
        key = tuple(str(platform.get(k, "")) for k in ("os", "architecture", "variant"))
        if key in seen:
            raise ValueError(f"two images for platform {'/'.join(k for k in key if k)}")
        seen.add(key)
        manifests.append({**image.manifest.descriptor(), "platform": dict(platform)})
    return {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": manifests}


def assemble_index(entries: Iterable[tuple[dict[str, Any], Image]], store: BlobStore) -> ImageIndex:
    entries = tuple(entries)
    doc = index_json(entries)
    blob = store.put_bytes(
        json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), MEDIA_INDEX
    )
    return ImageIndex(blob, entries)


def unpack(image: Image, store: BlobStore, dest: Path) -> None:
    """Extract ``image``'s layers, in order, into ``dest`` (our own layers only:
    no whiteouts, trusted content)."""
    dest.mkdir(parents=True, exist_ok=True)
    for layer in image.layers:
        with tarfile.open(store.path(layer.blob.digest), mode="r:gz") as tar:
            # Debian 12's python3.11 (3.11.2) predates extraction filters and
            # extracts everything as it is: what "fully_trusted" asks of the rest.
            trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(dest, **trusted)  # type: ignore[arg-type]
