"""Unpacking what `sandman cp POD:PATH LOCAL` downloads, safely, on every Python 3.11.

The archive comes from a sandbox, which the agent controls: a member named
``../../.bashrc`` or a symlink to ``/etc`` must not write outside the target.
Python 3.11.4 added extraction filters (PEP 706, ``filter="data"``); Python
3.11.0-3.11.3 (Debian 12 ships 3.11.2) have no ``filter`` argument at all, so
there the same rules are applied here, member by member, before anything is
written. Either way every member is checked first: a bad archive writes
nothing.

Standard library only (tests run it under the oldest supported Python).
"""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path, PurePosixPath

HAS_FILTERS = hasattr(tarfile, "data_filter")


class UnsafeArchive(Exception):
    """A member that would escape the target, or is not a plain file/dir/link."""


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([root, path]) == root


def vet(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """``filter="data"`` (PEP 706, as CPython 3.11.4 implements it) for Pythons
    without it: leading slashes stripped, nothing outside ``dest`` (names and
    link targets), no absolute link targets, no devices or FIFOs, no
    setuid/setgid/sticky or group/other-write bits, files readable and
    writable by their owner, ownership not taken from the archive."""
    root = os.path.realpath(dest)
    name = member.name.lstrip("/" + os.sep)
    if os.path.isabs(name):
        raise UnsafeArchive(f"{member.name!r}: absolute path")
    target = os.path.realpath(os.path.join(root, name))
    if not _inside(target, root):
        raise UnsafeArchive(f"{member.name!r}: outside the target directory")
    mode = member.mode & 0o755
    if member.isreg() or member.islnk():
        if not mode & stat.S_IXUSR:
            mode &= ~0o111
        mode |= stat.S_IRUSR | stat.S_IWUSR
    elif member.isdir():
        mode |= stat.S_IRWXU  # (3.11.4+ leaves a directory's mode alone; None breaks 3.11.2)
    elif not member.issym():
        raise UnsafeArchive(f"{member.name!r}: not a regular file, directory or link")
    if member.islnk() or member.issym():
        if os.path.isabs(member.linkname):
            raise UnsafeArchive(f"{member.name!r}: link to an absolute path {member.linkname!r}")
        base = os.path.join(root, os.path.dirname(name)) if member.issym() else root
        if not _inside(os.path.realpath(os.path.join(base, member.linkname)), root):
            raise UnsafeArchive(f"{member.name!r}: link out of the target ({member.linkname!r})")
    member.name, member.mode = name, mode
    # Extracting as root would chown to the archive's owner; keep ours.
    member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
    return member


def extract(tar: tarfile.TarFile, dest: Path, members: list[tarfile.TarInfo]) -> None:
    """Extract ``members`` into ``dest`` under the data filter's rules, all
    checked before the first is written (UnsafeArchive names the first bad one)."""
    dest.mkdir(parents=True, exist_ok=True)
    if HAS_FILTERS:
        for m in members:
            try:
                tarfile.data_filter(m, str(dest))
            except tarfile.FilterError as e:
                raise UnsafeArchive(str(e)) from None
        tar.extractall(dest, members=members, filter="data")
    else:
        tar.extractall(dest, members=[vet(m, str(dest)) for m in members])


def rename_top(members: list[tarfile.TarInfo], top: str, new: str) -> None:
    """``cp POD:/a/file ./other``: the archive's top entry ``top`` becomes ``new``."""

    def renamed(name: str) -> str:
        path = PurePosixPath(name.lstrip("/"))
        if path == PurePosixPath(top):
            return new
        if PurePosixPath(top) not in path.parents:
            raise UnsafeArchive(f"{name!r}: not under the copied {top!r}")
        return str(PurePosixPath(new) / path.relative_to(top))

    for m in members:
        m.name = renamed(m.name)
        if m.islnk():
            m.linkname = renamed(m.linkname)
