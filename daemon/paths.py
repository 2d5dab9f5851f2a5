"""Which paths the file API may touch (pure policy, no I/O beyond realpath).

Policy: by default the whole container filesystem belongs to the agent (it
is root in its own sandbox anyway, through exec); the daemon's own directory
(/.sandman: the executable, its extracted runtime, session scratch files) is
protected, so an agent cannot replace the daemon or read what it keeps there.
Operators may narrow the allowed roots. Symlinks and ``..`` are resolved
before the check, so neither can lead outside the allowed roots or into the
protected directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sandman.daemon.errors import BadRequest, Forbidden


def _within(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True)
class PathPolicy:
    allowed_roots: tuple[Path, ...]
    protected: tuple[Path, ...]

    def _check(self, real: str, raw: str) -> Path:
        roots = [os.path.realpath(r) for r in self.allowed_roots]
        if not any(_within(real, r) for r in roots):
            raise Forbidden(
                f"{raw!r} resolves to {real!r}, outside the allowed roots "
                f"({', '.join(map(str, self.allowed_roots))})",
                code="path_not_allowed",
            )
        for p in self.protected:
            prot = os.path.realpath(p)
            if _within(real, prot):
                raise Forbidden(f"{raw!r} is inside the daemon's own {prot}", code="path_protected")
        return Path(real)

    @staticmethod
    def _validate(raw: object) -> str:
        if not isinstance(raw, str) or not raw:
            raise BadRequest("path must be a non-empty string")
        if "\0" in raw:
            raise BadRequest("path must not contain NUL bytes")
        if not raw.startswith("/"):
            raise BadRequest(f"path must be absolute, got {raw!r}")
        return raw

    def target(self, raw: object) -> Path:
        """The path with every symlink followed: for reads and writes of content."""
        s = self._validate(raw)
        return self._check(os.path.realpath(s), s)

    def entry(self, raw: object) -> Path:
        """The directory entry itself (a symlink is not followed): for stat,
        remove and move, which act on the link rather than its target."""
        s = self._validate(raw)
        norm = os.path.normpath(s)
        if norm == "/":
            return self._check("/", s)
        parent, name = os.path.split(norm)
        real = os.path.join(os.path.realpath(parent), name)
        return self._check(real, s)
