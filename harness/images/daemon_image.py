"""The `sandman-daemon` image's contents (the daemon engineer's; tags: components.py).

What injected pods take the daemon from: today the static `sandmand` that
the init container copies into the sandbox's emptyDir. The image's tag is
not chosen here: every component image is tagged with the one Sandman
version (``sandman.harness.images.components``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sandman.harness.images import daemon_binary
from sandman.harness.images.oci import ImageConfig
from sandman.harness.images.recipes import LayerFn


def layers(cache_dir: Path) -> tuple[tuple[str, LayerFn], ...]:
    """(cache key, fill) per layer; the key must change whenever the content does."""
    key = daemon_binary.current_key()

    def fill(root: Path) -> None:
        exe = daemon_binary.ensure_daemon_binary(cache_dir)
        shutil.copy2(exe, root / "sandmand")
        (root / "sandmand").chmod(0o755)
        # `sandmand install` runs in this image: staticx unpacks into $TMPDIR
        # or /tmp before anything else happens, so /tmp must exist.
        (root / "tmp").mkdir(mode=0o1777)
        (root / "tmp").chmod(0o1777)

    return ((f"daemon-{key}", fill),)


CONFIG = ImageConfig(entrypoint=("/sandmand",), cmd=("version",), user="0:0", env=("PATH=/",))
