"""Sandman's component images and the one version string that tags them all.

``sandman-controller`` (webhook, reaper, extender: ``controller.py``),
``sandman-scheduler`` (the stock kube-scheduler the harness builds) and
``sandman-daemon`` (``daemon_image.py``) are all tagged with the same version:

- a release: ``sandman.__version__`` (the default; the committed manifests
  name it, and a unit test keeps the two equal);
- ``dev``: ``<release>-dev.<digest>``, where the digest covers every layer
  key of the three images. The local cluster uses it, so a code change gives
  new tags and `make up` rolls the Deployments; an unchanged tree keeps its
  tags, so nothing restarts. Any other string is taken as given.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from sandman.harness.cluster.binaries import binary_sets, build_set
from sandman.harness.cluster.config import Versions
from sandman.harness.images import controller, daemon_image, platforms
from sandman.harness.images.oci import ImageConfig
from sandman.harness.images.platforms import Arch
from sandman.harness.images.recipes import Recipe
from sandman.install.images import COMPONENTS, RELEASE, check_version, placeholder

DEV = "dev"
# Hex digits of the dev digest: 48 bits, plenty for the builds of one machine.
DEV_DIGEST_CHARS = 12
SCHEDULER_REVISION = 1


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _kube_scheduler(cache_dir: Path, arch: Arch | None = None) -> Path:
    """The harness's kube-scheduler build (built from the Go module proxy if
    missing); for another architecture, Go's cross-compiler (CGO_ENABLED=0,
    GOARCH) builds kube-scheduler alone, with the host build's caches."""
    kube = next(bs for bs in binary_sets(Versions()) if bs.name == "kube")
    if arch is None or platforms.is_host(arch):
        return build_set(kube, cache_dir) / "kube-scheduler"
    only = tuple(o for o in kube.outputs if o[1] == "kube-scheduler")
    cross = dataclasses.replace(kube, outputs=only)
    return build_set(cross, cache_dir, goarch=arch.name) / "kube-scheduler"


def _scheduler_layers(
    cache_dir: Path, arch: Arch | None = None
) -> tuple[tuple[str, Callable[[Path], None]], ...]:
    binary = _kube_scheduler(cache_dir, arch)
    key = f"scheduler-{Versions().kubernetes}-r{SCHEDULER_REVISION}-{_sha256_file(binary)[:16]}"

    def fill(root: Path) -> None:
        dest = root / "usr/local/bin/kube-scheduler"
        dest.parent.mkdir(parents=True)
        shutil.copy2(binary, dest)
        (root / "etc").mkdir()
        (root / "etc/passwd").write_text(
            "root:x:0:0:root:/root:/sbin/nologin\n"
            "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
        )
        (root / "etc/group").write_text("root:x:0:\nnonroot:x:65532:\n")
        (root / "tmp").mkdir()
        os.chmod(root / "tmp", 0o1777)

    return ((key, fill),)


SCHEDULER_CONFIG = ImageConfig(
    entrypoint=("/usr/local/bin/kube-scheduler",),
    env=("PATH=/usr/local/bin",),
    user="65532:65532",
    labels={
        "org.opencontainers.image.title": "sandman-scheduler",
        "dev.sandman.kubernetes-version": Versions().kubernetes,
    },
)


def layers(
    name: str, cache_dir: Path, arch: Arch | None = None
) -> tuple[tuple[str, Callable[[Path], None]], ...]:
    """(cache key, fill) per layer of ``name`` for ``arch`` (default: this machine's)."""
    if name == "controller":
        return controller.layers(arch)  # type: ignore[return-value]
    if name == "scheduler":
        return _scheduler_layers(cache_dir, arch)
    if name == "daemon":
        return daemon_image.layers(cache_dir, arch)
    raise ValueError(f"unknown component {name!r}; known: {', '.join(COMPONENTS)}")


def config(name: str, arch: Arch | None = None) -> ImageConfig:
    cfg = {
        "controller": controller.CONFIG,
        "scheduler": SCHEDULER_CONFIG,
        "daemon": daemon_image.CONFIG,
    }[name]
    arch = arch or platforms.host()
    return dataclasses.replace(cfg, architecture=arch.name, variant=arch.variant)


def dev_version(cache_dir: Path) -> str:
    """``<release>-dev.<digest of every component layer key>``."""
    h = hashlib.sha256()
    for name in COMPONENTS:
        for key, _fill in layers(name, cache_dir):
            h.update(f"{name}:{key}\n".encode())
    return f"{RELEASE}-{DEV}.{h.hexdigest()[:DEV_DIGEST_CHARS]}"


def resolve_version(version: str | None, cache_dir: Path) -> str:
    """None -> the release; ``dev`` -> the content-keyed dev version; else as given."""
    if version is None:
        version = os.environ.get("SANDMAN_VERSION") or RELEASE
    if version == DEV:
        return dev_version(cache_dir)
    return check_version(version)


def recipe(name: str, cache_dir: Path, version: str, arch: Arch | None = None) -> Recipe:
    """``name`` at ``version`` for ``arch``; the dev version's digest covers the
    host's layers only, so one tag names every architecture's build of a tree."""
    arch = arch or platforms.host()
    return Recipe(
        name=name,
        tag=check_version(version),
        layers=layers(name, cache_dir, arch),
        config=config(name, arch),
        repository=placeholder(name),
        verify=controller.image_check(arch) if name == "controller" else None,
    )
