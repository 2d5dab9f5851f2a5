"""Put a recorded tree back (synchronous; reset runs it in the thread pool).

Given how a tree differs from its record (``snapshot.compare``): new entries
and changed caches are deleted, and every changed or missing entry is made
again from what the record knows, parents first. Files come from the git
object store (each blob checked against its id by ``gitread``) or from the
copies in the record; links from their recorded targets; directories are
made and chmod-ed. Entries whose content the record does not hold cannot be
restored: they are returned as failures (the report's drift). Nothing here
runs a program, and nothing writes through a symlink: writes go to a new
file in the (restored) parent, renamed over the entry.

Runs after every process of the sandbox was killed, so nothing races it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat

from sandman.daemon.gitindex import GitReadError
from sandman.daemon.gitread import ObjectStore
from sandman.daemon.pristine import Record, TreeRecord
from sandman.daemon.snapshot import DIR, FILE, LINK, Diff, Entry, join, top_level


class Unrestorable(Exception):
    """The record holds no content for this entry (it is only verified)."""


def remove(path: str) -> None:
    """Delete a file, link or whole directory (symlinks are never followed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # fd-based on Linux: safe against symlinks inside
    else:
        os.unlink(path)


def _content(digest: str, rel: str, rec: Record, store: ObjectStore | None) -> bytes:
    if digest == "o:":  # a loose object git moved into a pack (gc): written again
        if store is None:
            raise Unrestorable("the repository's objects are not available")
        head, name = os.path.split(rel)
        return store.loose(os.path.basename(head) + name)
    if digest.startswith("g:"):
        if store is None:
            raise Unrestorable("the repository's objects are not available")
        return store.blob(digest[2:])
    if digest.startswith("s:"):
        data = rec.saved.get(digest[2:])
        if data is not None:
            return data
    raise Unrestorable("its content is not kept (it is only verified)")


def _owner(path: str, uid: int, gid: int, *, follow: bool = True) -> None:
    st = os.stat(path, follow_symlinks=follow)
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(path, uid, gid, follow_symlinks=follow)


def _put(root: str, rel: str, entry: Entry, rec: Record, store: ObjectStore | None) -> None:
    kind, mode, uid, gid, _size, mtime_ns, _ctime, _ino, digest = entry
    path = join(root, rel)
    try:
        cur: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        cur = None
    if kind == DIR:
        if cur is not None and not stat.S_ISDIR(cur.st_mode):
            remove(path)
            cur = None
        if cur is None:
            os.mkdir(path, 0o700)
        _owner(path, uid, gid)
        os.chmod(path, mode)
    elif kind == LINK:
        if not digest.startswith("l:"):
            raise Unrestorable("its target is not kept")
        if cur is not None:
            remove(path)
        os.symlink(digest[2:], path)
        _owner(path, uid, gid, follow=False)
    elif kind == FILE:
        data = _content(digest, rel, rec, store)
        parent, name = os.path.split(path)
        tmp = os.path.join(parent, f".{name}.sandman-restore")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            st = os.fstat(fd)
            if (st.st_uid, st.st_gid) != (uid, gid):
                os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)  # after chown, which clears setuid bits
        finally:
            os.close(fd)
        os.utime(tmp, ns=(mtime_ns, mtime_ns), follow_symlinks=False)
        if cur is not None and stat.S_ISDIR(cur.st_mode):
            remove(path)
        os.replace(tmp, path)
    else:
        raise Unrestorable("devices, FIFOs and sockets are not made again")


def _order(rel: str) -> tuple[str, ...]:
    return () if rel == "." else tuple(rel.split("/"))


def restore_tree(
    tree: TreeRecord, diff: Diff, rec: Record, store: ObjectStore | None
) -> tuple[int, list[str]]:
    """(entries put back or removed, failures as "path: why")."""
    root = tree.root
    done = 0
    failures: list[str] = []
    for rel in top_level(diff.caches + diff.extra):
        try:
            remove(join(root, rel))
            done += 1
        except OSError as e:
            failures.append(f"{join(root, rel)}: cannot remove: {e.strerror}")
    broken: list[str] = []  # directories that could not be made: skip their contents
    for rel in sorted(set(diff.changed) | set(diff.missing), key=_order):
        if any(rel.startswith(b + "/") for b in broken):
            continue
        entry = tree.entries[rel]
        try:
            _put(root, rel, entry, rec, store)
            done += 1
        except (OSError, GitReadError, Unrestorable) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            failures.append(f"{join(root, rel)}: cannot restore: {why}")
            if entry[0] == DIR:
                broken.append(rel)
    return done, failures
