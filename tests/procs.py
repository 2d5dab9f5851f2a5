"""Live processes, read from /proc, for tests that check what a command left running."""

from __future__ import annotations

import os
from pathlib import Path


def processes_mentioning(text: str) -> dict[int, str]:
    """pid -> command of live (not zombie) processes whose command line contains ``text``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text.encode() in cmdline and state != "Z":
            found[int(entry)] = cmdline.split(b"\0", 1)[0].decode(errors="replace")
    return found
