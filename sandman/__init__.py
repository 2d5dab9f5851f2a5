"""Sandman: Kubernetes-native sandboxes for agentic RL and agent evaluation.

``from sandman import Sandbox`` is the synchronous SDK (``sandman.client.sync``);
``sandman.client`` is the asyncio one.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# Imported on first use: the components (webhook, reaper) import sandman.* and
# need none of the SDK.
_SYNC = ("Sandbox", "SyncClient", "connect")


def __getattr__(name: str) -> Any:
    if name in _SYNC:
        from sandman.client import sync

        return getattr(sync, name)
    raise AttributeError(f"module 'sandman' has no attribute {name!r}")
