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

from sandman.harness.cluster.config import default_cache_dir
from sandman.harness.images import components, platforms
from sandman.harness.images.addons import ADDON_RECIPES
from sandman.harness.images.oci import (
    MEDIA_LAYER_GZIP,
    Blob,
    BlobStore,
    Image,
    ImageIndex,
    Layer,
    assemble,
    assemble_index,
    layer_from_dir,
    unpack,
)
from sandman.harness.images.platforms import Arch
from sandman.harness.images.recipes import RECIPES, Recipe
from sandman.harness.images.registry import Registry
from sandman.install.images import COMPONENTS

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


# Test images (recipes.py), the local cluster's add-ons (addons.py), then
# Sandman's components (components.py).
IMAGE_NAMES = (*sorted(RECIPES), *sorted(ADDON_RECIPES), *COMPONENTS)


def recipe(
    name: str,
    cache_dir: Path | None = None,
    version: str | None = None,
    arch: Arch | None = None,
) -> Recipe:
    """The recipe of ``name`` for ``arch`` (default: this machine's); components
    are tagged with ``version`` (see components.py)."""
    cache_dir = cache_dir or default_cache_dir()
    if name in COMPONENTS:
        v = components.resolve_version(version, cache_dir)
        return components.recipe(name, cache_dir, v, arch)
    if arch is not None and not platforms.is_host(arch):
        # The test images and add-ons are the local cluster's own, which runs
        # on this machine: built from its own files (gcc -static, busybox,
        # debootstrap) for its architecture only.
        raise ImageBuildError(
            f"image {name} is built for this machine's architecture "
            f"({platforms.host()}) only: it serves the local cluster; --arch {arch} "
            f"applies to Sandman's component images ({', '.join(COMPONENTS)})"
        )
    if name in ADDON_RECIPES:
        return ADDON_RECIPES[name]()
    try:
        return RECIPES[name]
    except KeyError:
        raise ImageBuildError(f"unknown image {name!r}; known: {', '.join(IMAGE_NAMES)}") from None


def image_ref(
    name: str,
    registry: str = DEFAULT_REGISTRY,
    cache_dir: Path | None = None,
    version: str | None = None,
) -> str:
    r = recipe(name, cache_dir, version)
    return f"{registry}/{r.repo}:{r.tag}"


class ImageBuilder:
    """Builds recipes into a blob store under the cache dir.

    Safe for one builder per cache at a time; concurrent builders of the same
    layer key would both build it and the second rename would win (same bytes
    by construction, so the result is still correct).
    """

    def __init__(self, cache_dir: Path, progress: Progress = _stderr) -> None:
        self.cache_dir = cache_dir
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

    def build(self, name: str, version: str | None = None, arch: Arch | None = None) -> Image:
        """``name`` for ``arch`` (default: this machine's)."""
        r = recipe(name, self.cache_dir, version, arch)
        missing = [cmd for cmd in r.needs if shutil.which(cmd) is None]
        if missing:
            raise ImageBuildError(f"image {name} needs {', '.join(missing)} on PATH")
        layers = [self.layer(key, fill) for key, fill in r.layers]
        image = assemble(layers, r.config, self.store)
        if r.verify is not None:
            self._verify(name, image, r.verify)
        return image

    def build_all(
        self, name: str, version: str | None, arches: tuple[Arch, ...]
    ) -> Image | ImageIndex:
        """One image for one architecture; for several, an index of one image
        each (in the order given), so that each node pulls its own."""
        images = [(arch, self.build(name, version, arch)) for arch in arches]
        if len(images) == 1:
            return images[0][1]
        return assemble_index(((a.platform(), img) for a, img in images), self.store)

    def _verify(self, name: str, image: Image, check: Callable[[Path], None]) -> None:
        marker = self.root / "verified" / image.manifest.digest.replace(":", "-")
        if marker.exists():
            return
        work = Path(tempfile.mkdtemp(prefix=f"sandman-verify-{name}-"))
        try:
            unpack(image, self.store, work)
            check(work)
        except Exception as e:
            raise ImageBuildError(f"image {name} failed its check: {e}") from e
        finally:
            shutil.rmtree(work, ignore_errors=True)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()

    def build_and_push(
        self, name: str, registry: Registry, version: str | None = None, arch: Arch | None = None
    ) -> BuiltImage:
        """Build and push to a loopback registry (the harness's own, plain HTTP);
        any other registry goes through `sandman image push` (skopeo, auth, TLS)."""
        r = recipe(name, self.cache_dir, version, arch)
        image = self.build(name, r.tag if name in COMPONENTS else None, arch)
        if not registry.ping():
            raise ImageBuildError(
                f"registry {registry.host} is not answering; start it with "
                "`sandman cluster up --real-node`"
            )
        uploaded = registry.push(r.repo, r.tag, image, self.store)
        return BuiltImage(name, f"{registry.host}/{r.repo}:{r.tag}", image, uploaded)
