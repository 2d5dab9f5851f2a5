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
from sandman.harness.images import daemon_binary
from sandman.harness.images.oci import (
    MEDIA_LAYER_GZIP,
    Blob,
    BlobStore,
    Image,
    ImageConfig,
    Layer,
    assemble,
    layer_from_dir,
)
from sandman.harness.images.recipes import RECIPES, Recipe
from sandman.harness.images.registry import Registry

DEFAULT_REGISTRY = "127.0.0.1:5000"
DAEMON_IMAGE = "daemon"

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


IMAGE_NAMES = (*sorted(RECIPES), DAEMON_IMAGE)


def recipe(name: str, cache_dir: Path | None = None) -> Recipe:
    if name == DAEMON_IMAGE:
        return daemon_recipe(cache_dir or default_cache_dir())
    try:
        return RECIPES[name]
    except KeyError:
        raise ImageBuildError(f"unknown image {name!r}; known: {', '.join(IMAGE_NAMES)}") from None


def daemon_recipe(cache_dir: Path) -> Recipe:
    """The `daemon` image: the static `sandmand` (plus /tmp for its unpacking).

    Its tag carries the executable's content key, so a changed daemon gets a
    new reference and nodes never run a stale cached copy under an old tag.
    """
    key = daemon_binary.current_key()

    def fill(root: Path) -> None:
        exe = daemon_binary.ensure_daemon_binary(cache_dir)
        shutil.copy2(exe, root / "sandmand")
        (root / "sandmand").chmod(0o755)
        # `sandmand install` runs in this image: staticx unpacks into $TMPDIR
        # or /tmp before anything else happens, so /tmp must exist.
        (root / "tmp").mkdir(mode=0o1777)
        (root / "tmp").chmod(0o1777)

    return Recipe(
        name=DAEMON_IMAGE,
        tag=f"{daemon_binary.daemon_version()}-{key[:12]}",
        layers=((f"daemon-{key}", fill),),
        config=ImageConfig(
            entrypoint=("/sandmand",), cmd=("version",), user="0:0", env=("PATH=/",)
        ),
    )


def image_ref(name: str, registry: str = DEFAULT_REGISTRY, cache_dir: Path | None = None) -> str:
    r = recipe(name, cache_dir)
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

    def build(self, name: str) -> Image:
        r = recipe(name, self.cache_dir)
        missing = [cmd for cmd in r.needs if shutil.which(cmd) is None]
        if missing:
            raise ImageBuildError(f"image {name} needs {', '.join(missing)} on PATH")
        layers = [self.layer(key, fill) for key, fill in r.layers]
        return assemble(layers, r.config, self.store)

    def build_and_push(self, name: str, registry: Registry) -> BuiltImage:
        image = self.build(name)
        r = recipe(name, self.cache_dir)
        if not registry.ping():
            raise ImageBuildError(
                f"registry {registry.host} is not answering; start it with "
                "`sandman cluster up --real-node`"
            )
        uploaded = registry.push(r.repo, r.tag, image, self.store)
        return BuiltImage(name, f"{registry.host}/{r.repo}:{r.tag}", image, uploaded)
