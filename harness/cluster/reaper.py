"""How the harness runs the reaper as a host process (argv and URLs).

The local cluster's deployment, the reaper benchmark and the tests start
``serve_argv(...)``; in a cluster the manifests run the same command in a
Deployment (manifests/reaper/).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

# Health and metrics on loopback: the reaper is a host process here.
HOST = "127.0.0.1"


def serve_argv(
    port: int,
    kubeconfig: Path | str,
    *,
    host: str = HOST,
    python: str = sys.executable,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of a host-process reaper (`python -m sandman.reaper serve`);
    ``extra`` flags follow, e.g. ``--watch-namespace=NS``, ``--no-leader-elect``."""
    return [
        python,
        "-m",
        "sandman.reaper",
        "serve",
        f"--listen={host}:{port}",
        f"--kubeconfig={kubeconfig}",
        *extra,
    ]


def url(port: int, path: str, host: str = HOST) -> str:
    """``/readyz`` (200 once its watch has listed), ``/healthz`` or ``/metrics``."""
    return f"http://{host}:{port}{path}"
