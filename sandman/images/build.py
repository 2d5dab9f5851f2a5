"""Build an image from its recipe (layers cached by key) and push it."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandman.images.oci import (
    MEDIA_LAYER_GZIP,
    Blob,
    BlobStore,
    Image,
    Layer,
    assemble,
    layer_from_dir,
)
from sandman.images.recipes import RECIPES, Recipe
from sandman.images.registry import Registry

DEFAULT_REGISTRY = "127.0.0.1:5000"

Progress = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class ImageBuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class BuiltImage:
    name: str
    ref: str
    image: Image
    uploaded_bytes: int


def recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ImageBuildError(
            f"unknown image {name!r}; known: {', '.join(sorted(RECIPES))}"
        ) from None


def image_ref(name: str, registry: str = DEFAULT_REGISTRY) -> str:
    r = recipe(name)
    return f"{registry}/{r.repo}:{r.tag}"


class ImageBuilder:
    """Builds recipes into a blob store under the cache dir.

    Safe for one builder per cache at a time; concurrent builders of the same
    layer key would both build it and the second rename would win (same bytes
    by construction, so the result is still correct).
    """

    def __init__(self, cache_dir: Path, progress: Progress = _stderr) -> None:
        self.root = cache_dir / "images"
        self.store = BlobStore(self.root / "blobs")
        self.progress = progress

    def _cached_layer(self, key: str) -> Layer | None:
        meta = self.root / "layers" / f"{key}.json"
        if not meta.exists():
            return None
        d = json.loads(meta.read_text())
        if not self.store.has(d["digest"]):
            return None
        return Layer(Blob(d["digest"], d["size"], MEDIA_LAYER_GZIP), d["diff_id"])

    def layer(self, key: str, fill: Callable[[Path], None]) -> Layer:
        cached = self._cached_layer(key)
        if cached is not None:
            return cached
        t0 = time.monotonic()
        self.progress(f"  building layer {key} ...")
        work = Path(tempfile.mkdtemp(prefix=f"sandman-layer-{key}-"))
        try:
            rootfs = work / "rootfs"
            rootfs.mkdir()
            fill(rootfs)
            layer = layer_from_dir(rootfs, self.store)
        except Exception as e:
            raise ImageBuildError(f"layer {key}: {e}") from e
        finally:
            shutil.rmtree(work, ignore_errors=True)
        meta = self.root / "layers" / f"{key}.json"
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(
            json.dumps(
                {"digest": layer.blob.digest, "size": layer.blob.size, "diff_id": layer.diff_id}
            )
        )
        self.progress(
            f"  layer {key}: {layer.blob.size / 1e6:.1f} MB compressed "
            f"({time.monotonic() - t0:.0f}s)"
        )
        return layer

    def build(self, name: str) -> Image:
        r = recipe(name)
        missing = [cmd for cmd in r.needs if shutil.which(cmd) is None]
        if missing:
            raise ImageBuildError(f"image {name} needs {', '.join(missing)} on PATH")
        layers = [self.layer(key, fill) for key, fill in r.layers]
        return assemble(layers, r.config, self.store)

    def build_and_push(self, name: str, registry: Registry) -> BuiltImage:
        image = self.build(name)
        r = recipe(name)
        if not registry.ping():
            raise ImageBuildError(
                f"registry {registry.host} is not answering; start it with "
                "`sandman cluster up --real-node`"
            )
        uploaded = registry.push(r.repo, r.tag, image, self.store)
        return BuiltImage(name, f"{registry.host}/{r.repo}:{r.tag}", image, uploaded)
