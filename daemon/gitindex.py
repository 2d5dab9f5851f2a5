"""Where a git repository is, what HEAD names and what the index holds,
read natively (see ``gitread`` for why the daemon runs no git).

Formats: gitformat-index(5) versions 2-4 (stage 0 entries; skip-worktree
and sparse-directory entries left out; a split index is refused), HEAD and
refs as files or in packed-refs, ``.git`` files and linked worktrees'
``commondir``, ``extensions.objectFormat`` for SHA-256 repositories.
Synchronous and stateless.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path


class GitReadError(Exception):
    """The repository cannot be read as needed; the message says what."""


OID_BYTES = {"sha1": 20, "sha256": 32}


@dataclass(frozen=True)
class IndexEntry:
    path: str
    mode: int
    oid: str
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int


def git_dir_of(workspace: Path) -> Path | None:
    """The repository of a checkout: ``.git`` or the dir a ``.git`` file names."""
    dot = workspace / ".git"
    if dot.is_dir() and not dot.is_symlink():
        return dot
    if dot.is_file() and not dot.is_symlink():
        text = dot.read_text(errors="replace").strip()
        if text.startswith("gitdir:"):
            target = Path(text[len("gitdir:") :].strip())
            return (workspace / target).resolve() if not target.is_absolute() else target
    return None


def common_dir(git_dir: Path) -> Path:
    """Where objects and refs live (a linked worktree's ``commondir``)."""
    try:
        text = (git_dir / "commondir").read_text().strip()
    except OSError:
        return git_dir
    p = Path(text)
    return p if p.is_absolute() else (git_dir / p).resolve()


def read_head(git_dir: Path) -> tuple[str | None, str | None]:
    """(commit id, branch name or None when detached); (None, None) if unborn."""
    try:
        head = (git_dir / "HEAD").read_text().strip()
    except OSError:
        return None, None
    if not head.startswith("ref:"):
        return head or None, None
    ref = head[4:].strip()
    branch = ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else None
    common = common_dir(git_dir)
    for base in (git_dir, common):
        try:
            return (base / ref).read_text().strip(), branch
        except OSError:
            continue
    try:
        for line in (common / "packed-refs").read_text().splitlines():
            oid, _, name = line.partition(" ")
            if name == ref:
                return oid, branch
    except OSError:
        pass
    return None, branch


def hash_name(git_dir: Path) -> str:
    """ "sha256" for repositories made with ``--object-format=sha256``, else "sha1"."""
    try:
        text = (common_dir(git_dir) / "config").read_text(errors="replace").lower()
    except OSError:
        return "sha1"
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "objectformat" and value.strip().strip('"') == "sha256":
            return "sha256"
    return "sha1"


def read_index(path: Path, hash_name: str = "sha1") -> list[IndexEntry]:
    """Stage-0 entries of a v2/v3/v4 index (not those marked skip-worktree)."""
    data = path.read_bytes()
    if len(data) < 12 or data[:4] != b"DIRC":
        raise GitReadError(f"{path} is not a git index")
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3, 4):
        raise GitReadError(f"{path}: index version {version} is not supported")
    oid_len = OID_BYTES[hash_name]
    out: list[IndexEntry] = []
    pos, prev = 12, b""
    try:
        for _ in range(count):
            start = pos
            ctime_s, ctime_n, mtime_s, mtime_n, _dev, ino, mode, _uid, _gid, size = struct.unpack(
                ">10I", data[pos : pos + 40]
            )
            pos += 40
            oid = data[pos : pos + oid_len].hex()
            pos += oid_len
            (flags,) = struct.unpack(">H", data[pos : pos + 2])
            pos += 2
            extended = 0
            if flags & 0x4000:
                (extended,) = struct.unpack(">H", data[pos : pos + 2])
                pos += 2
            if version == 4:
                strip, pos = varint(data, pos)
                end = data.index(b"\0", pos)
                name = prev[: len(prev) - strip] + data[pos:end]
                pos = end + 1
            else:
                end = data.index(b"\0", pos)
                name = data[pos:end]
                pos = start + ((end - start + 8) // 8) * 8  # NUL-padded to 8 bytes
            prev = name
            stage = (flags >> 12) & 3
            skip_worktree = bool(extended & 0x4000)
            if stage == 0 and not skip_worktree and (mode >> 12) != 0o04:  # no sparse dirs
                out.append(
                    IndexEntry(
                        os.fsdecode(name),
                        mode,
                        oid,
                        size,
                        mtime_s * 1_000_000_000 + mtime_n,
                        ctime_s * 1_000_000_000 + ctime_n,
                        ino,
                    )
                )
        while pos + 8 <= len(data) - oid_len:  # extensions, then the checksum
            sig, length = data[pos : pos + 4], struct.unpack(">I", data[pos + 4 : pos + 8])[0]
            if sig == b"link":
                raise GitReadError(f"{path} is a split index; its entries live in another file")
            pos += 8 + length
    except (struct.error, ValueError, IndexError):
        raise GitReadError(f"{path} is damaged") from None
    return out


def varint(data: bytes, pos: int) -> tuple[int, int]:
    """The offset encoding of index v4 and of OFS_DELTA (big-endian, +1 per byte)."""
    b = data[pos]
    value = b & 0x7F
    pos += 1
    while b & 0x80:
        b = data[pos]
        value = ((value + 1) << 7) | (b & 0x7F)
        pos += 1
    return value, pos
