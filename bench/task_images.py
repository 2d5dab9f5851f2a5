"""One image per problem, as in an RL batch: tiny's layers plus a unique one.

Every (run, problem) gets its own tag with its own incompressible layer, so
each strategy starts from the same cache state (its images never pulled) and
pays a real pull, instead of the first strategy warming the node for the rest.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sandman.harness.cluster.config import ClusterConfig
from sandman.harness.images.build import ImageBuilder, recipe
from sandman.harness.images.oci import assemble, layer_from_dir
from sandman.harness.images.registry import Registry

REPO = "sandman/task"


def build_task_images(
    registry_host: str, tags: list[str], *, layer_mb: float, cache_dir: Path | None = None
) -> list[str]:
    """Push ``127.0.0.1:PORT/sandman/task:<tag>`` for each tag; returns the refs."""
    builder = ImageBuilder(cache_dir or ClusterConfig().cache_dir, progress=lambda _m: None)
    base = builder.build("tiny")
    config = recipe("tiny", builder.cache_dir).config
    registry = Registry(registry_host)
    refs = []
    for tag in tags:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "problem").write_text(tag + "\n")
            (root / "payload.bin").write_bytes(os.urandom(int(layer_mb * 1e6)))
            extra = layer_from_dir(root, builder.store, level=1)
        image = assemble([*base.layers, extra], config, builder.store)
        registry.push(REPO, tag, image, builder.store)
        refs.append(f"{registry_host}/{REPO}:{tag}")
    return refs
