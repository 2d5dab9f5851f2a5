"""Live processes, for tests that check what a command left running."""

from __future__ import annotations

import contextlib
from pathlib import Path

from sandman.harness.cluster.hostsetup import pids_with_arg


def processes_mentioning(text: str) -> dict[int, str]:
    """pid -> command of live (not zombie) processes whose command line contains ``text``."""
    found = {}
    for pid in pids_with_arg(text):
        with contextlib.suppress(OSError):  # gone since
            found[pid] = (
                Path(f"/proc/{pid}/cmdline")
                .read_bytes()
                .split(b"\0", 1)[0]
                .decode(errors="replace")
            )
    return found
