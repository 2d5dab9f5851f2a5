"""`sandmand install`: place the daemon's runtime tree where a sandbox runs it.

Runs in the init container, from the daemon image, whose tree lies at
``sys.prefix`` (``/.sandman/rt``). Two modes:

- per pod (default): copy the tree into ``DEST/rt`` (the pod's emptyDir,
  mounted at /.sandman in the sandbox);
- shared (``--shared DIR``): ``DIR`` is a node directory (hostPath) that the
  sandbox mounts read-only at ``/.sandman/shared``. The tree goes to
  ``DIR/<key>/rt`` once per node and tree content (``key`` from the tree's
  VERSION file), and ``DEST/rt`` becomes a symlink to
  ``/.sandman/shared/<key>/rt``: nothing is copied for later pods.

With ``--release-image IMAGE`` (the node installer, a DaemonSet: the
"node" delivery), ``DIR/release/NAME`` (NAME = ``daemon_release(IMAGE)``)
is made a symlink to ``../<key>/rt`` after
the tree is in place; sandboxes then mount that path read-only at
``/.sandman/rt`` and need no install step of their own.

Either way the tree is copied to a private temporary name and renamed into
place, so a reader never sees half a tree, and two pods installing at once
both succeed (the loser's rename finds the winner's tree and drops its own).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from sandman.contract import DAEMON_RELEASES, DAEMON_SHARED_MOUNT

MARKER = "VERSION"  # "<daemon version> <tree key>", written last by the build
SHARED_MOUNT = DAEMON_SHARED_MOUNT  # where the sandbox sees the node directory


def runtime_root() -> Path:
    """The tree this interpreter runs from (``.../rt``)."""
    return Path(sys.prefix)


def tree_key(rt: Path) -> str:
    parts = (rt / MARKER).read_text().split()
    if len(parts) != 2 or not parts[1].isalnum():
        raise ValueError(f"{rt / MARKER} does not hold '<version> <key>'")
    return parts[1]


def _read_only(root: Path) -> None:
    """No write bit anywhere below ``root`` (directories included): besides
    the read-only mount, nothing on the node writes a shared tree by mistake."""
    for d, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            p = os.path.join(d, name)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode & ~0o222)
        os.chmod(d, os.stat(d).st_mode & ~0o222)


def _copy_tree(src: Path, dest: Path, *, read_only: bool = False) -> bool:
    """Copy ``src`` to ``dest`` atomically; False if ``dest`` already existed."""
    if (dest / MARKER).exists():
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    shutil.copytree(src, tmp, symlinks=True)
    if read_only:
        _read_only(tmp)
    try:
        os.rename(tmp, dest)
    except OSError:
        _discard(tmp)
        if (dest / MARKER).exists():
            return False  # another installer won the race: same content
        raise
    return True


def _discard(tmp: Path) -> None:
    for d, _, _ in os.walk(tmp):  # read-only dirs first get their write bit back
        os.chmod(d, 0o755)
    shutil.rmtree(tmp, ignore_errors=True)


def install(
    dest: str, shared_dir: str | None = None, release: str | None = None
) -> tuple[Path, bool]:
    """(where the tree now is, whether this call copied it)."""
    src = runtime_root()
    if not (src / MARKER).exists():
        raise FileNotFoundError(f"{src} is not a daemon runtime tree (no {MARKER})")
    if shared_dir is None:
        if release is not None:
            raise ValueError("--release-image needs --shared (the node directory)")
        target = Path(dest) / "rt"
        return target, _copy_tree(src, target)
    key = tree_key(src)
    target = Path(shared_dir) / key / "rt"
    copied = _copy_tree(src, target, read_only=True)
    _link(Path(dest) / "rt", f"{SHARED_MOUNT}/{key}/rt")
    if release is not None:
        if not release.isalnum():
            raise ValueError(f"release name {release!r}: letters and digits only")
        # Relative, so it resolves on the node (the kubelet mounts it) as in here.
        _link(Path(shared_dir) / DAEMON_RELEASES / release, f"../{key}/rt")
    return target, copied


def _link(link: Path, to: str) -> None:
    """``link`` -> ``to``, replaced atomically (a reader sees the old or the new)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(to, tmp)
    os.replace(tmp, link)
