"""Images of the local cluster's own add-ons (not Sandman components).

``coredns``: the static CoreDNS binary the harness builds (hack/coredns), as
the only file of a one-layer image, like upstream's distroless one.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from sandman.harness.cluster.binaries import binary_sets, build_set
from sandman.harness.cluster.config import Versions, default_cache_dir
from sandman.harness.images.oci import ImageConfig
from sandman.harness.images.recipes import Recipe

COREDNS_REVISION = 1


def _coredns_binary() -> Path:
    bs = next(b for b in binary_sets(Versions()) if b.name == "coredns")
    return build_set(bs, default_cache_dir()) / "coredns"


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def _coredns_fill(root: Path) -> None:
    shutil.copy2(_coredns_binary(), root / "coredns")
    (root / "coredns").chmod(0o755)


def coredns_recipe() -> Recipe:
    version = Versions().coredns
    binary = _coredns_binary()
    return Recipe(
        name="coredns",
        tag=version.lstrip("v"),
        layers=((f"coredns-{version}-r{COREDNS_REVISION}-{_file_digest(binary)}", _coredns_fill),),
        config=ImageConfig(entrypoint=("/coredns",), env=("PATH=/",), user="65532:65532"),
    )


# name -> recipe factory (called when the image is asked for: it may build).
ADDON_RECIPES = {"coredns": coredns_recipe}
