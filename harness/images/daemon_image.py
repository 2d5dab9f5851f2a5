"""The `sandman-daemon` image's contents (the daemon engineer's; tags: components.py).

The daemon's runtime tree (``daemon_binary.py``) at ``/.sandman/rt`` and
nothing else: the init container runs ``sandmand install`` from it, which
copies the tree into the pod's emptyDir (or, in the shared mode, once per
node into a read-only node directory). The tree's ELF interpreter path is
absolute (``/.sandman/rt/lib/ld-linux-x86-64.so.2``, or
``ld-linux-aarch64.so.1`` for arm64), which is why it sits at
that path in this image too. Non-root (Pod Security `restricted`). The image's
tag is not chosen here: every component image is tagged with the one Sandman
version (``sandman.harness.images.components``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sandman.harness.images import daemon_binary, platforms
from sandman.harness.images.oci import ImageConfig
from sandman.harness.images.platforms import Arch
from sandman.harness.images.recipes import LayerFn


def layers(cache_dir: Path, arch: Arch | None = None) -> tuple[tuple[str, LayerFn], ...]:
    """(cache key, fill) per layer; the key must change whenever the content does
    (another architecture's tree has its own key: its files differ)."""
    arch = arch or platforms.host()
    key = daemon_binary.current_key(arch, cache_dir)

    def fill(root: Path) -> None:
        tree = daemon_binary.ensure_daemon_tree(cache_dir, arch=arch)
        (root / ".sandman").mkdir(mode=0o755)
        shutil.copytree(tree / "rt", root / ".sandman" / "rt", symlinks=True)

    return ((f"daemon-tree-{key}", fill),)


CONFIG = ImageConfig(
    entrypoint=tuple(daemon_binary.serve_argv()),
    cmd=("version",),
    user=f"{daemon_binary.IMAGE_UID}:{daemon_binary.IMAGE_UID}",
    env=("PATH=/.sandman/rt/bin",),
)
