"""Content snapshots of directory trees: what reset restores and verifies against.

An entry is a tuple ``(kind, mode, uid, gid, size, mtime_ns, ctime_ns, ino,
digest)`` keyed by its path relative to the snapshot's root ("." is the root).
The stat part is a fingerprint: an entry whose fingerprint is unchanged has
unchanged content, because every write, truncation, rename or chmod moves the
inode's ctime to "now" and nobody can set ctime back without setting the
system clock (CAP_SYS_TIME, which a sandbox is never given). So comparing a
tree costs one lstat per entry, and content is hashed only for entries whose
fingerprint moved (the files a reset rewrote, or the agent touched).

``digest`` says what is known of the content:
  ``g:<id>``  the git blob with that id (restorable from the object store)
  ``s:<h>``   a copy kept in the pristine record under BLAKE2b ``h`` (restorable)
  ``b:<h>``   only its BLAKE2b (verifiable, not restorable)
  ``l:<t>``   a symlink to ``t`` (restorable)
  ``o:``      a loose git object: its content hashes to its own name
  ``x:``      unknown (changed before it could be hashed): any change is drift
  ``""``      fingerprint only (directories; files nothing may change)
All of this is synchronous file-system work: callers run it in the thread pool.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sandman.daemon.gitread import blob_id

FILE, DIR, LINK, OTHER = "f", "d", "l", "o"
Entry = tuple[str, int, int, int, int, int, int, int, str]
READ_CHUNK = 1 << 20
MAX_OBJECT_BYTES = 256 << 20  # a loose object bigger than this is not re-checked
# Paths under a __pycache__ directory are caches: Python rewrites them from
# the sources (which are verified). Reset deletes new or changed ones instead
# of calling them drift, so a test run does not make a sandbox unreusable,
# and a planted .pyc (which Python would load instead of its source) is gone.
CACHE_DIR = "__pycache__"


class TooLarge(Exception):
    """A tree has more entries than a snapshot may hold."""


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return FILE
    if stat.S_ISDIR(mode):
        return DIR
    if stat.S_ISLNK(mode):
        return LINK
    return OTHER


def entry_of(st: os.stat_result, digest: str = "") -> Entry:
    return (
        kind_of(st.st_mode),
        stat.S_IMODE(st.st_mode),
        st.st_uid,
        st.st_gid,
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
        st.st_ino,
        digest,
    )


def is_cache(rel: str) -> bool:
    return CACHE_DIR in rel.split("/")


def join(root: str, rel: str) -> str:
    return root if rel == "." else f"{root.rstrip('/')}/{rel}"


def walk(
    root: str,
    skip: frozenset[tuple[int, int]],
    limit: int,
    descend: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of the root and everything under it, parents
    first; never follows a symlink; directories in ``skip`` (device, inode)
    are left out with their contents, and so are the contents of directories
    ``descend`` says no to. Entries that vanish meanwhile are skipped."""
    st = os.lstat(root)
    yield ".", st
    if not stat.S_ISDIR(st.st_mode):
        return
    count = 1
    stack = [("", root)]
    while stack:
        rel_dir, path = stack.pop()
        try:
            it = os.scandir(path)
        except OSError:  # vanished, or unreadable to a non-root daemon: its entry counts
            continue
        with it:
            children = []
            for e in it:
                try:
                    cst = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(cst.st_mode) and (cst.st_dev, cst.st_ino) in skip:
                    continue
                children.append((e.name, e.path, cst))
        children.sort()
        for name, cpath, cst in children:
            count += 1
            if count > limit:
                raise TooLarge(f"{root} has more than {limit} entries")
            rel = f"{rel_dir}{name}"
            yield rel, cst
            if stat.S_ISDIR(cst.st_mode) and (descend is None or descend(rel)):
                stack.append((rel + "/", cpath))


def read_regular(path: str, max_bytes: int | None = None) -> bytes:
    """A regular file's bytes: never follows a symlink, never blocks on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "not a regular file", path)
        if max_bytes is not None and st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"over {max_bytes} bytes", path)
        parts = []
        while chunk := os.read(fd, READ_CHUNK):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def file_digest(path: str) -> str:
    """BLAKE2b of a regular file ("b:..."), streamed; refuses non-regular files.

    BLAKE2b, not SHA-256: the daemon's interpreter has no OpenSSL, and its
    built-in BLAKE2b is about three times faster than its built-in SHA-256.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IsADirectoryError(errno.EISDIR, "not a regular file", path)
        h = hashlib.blake2b(digest_size=20)
        while chunk := os.read(fd, READ_CHUNK):
            h.update(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)


def content_digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=20).hexdigest()


def same_content(path: str, digest: str, hash_name: str) -> bool:
    """Whether the file at ``path`` has the content ``digest`` describes."""
    try:
        if digest == "o:":  # a loose git object: named by the hash of its content
            head, name = os.path.split(path)
            data = zlib.decompress(read_regular(path, MAX_OBJECT_BYTES))
            return hashlib.new(hash_name, data).hexdigest() == os.path.basename(head) + name
        if digest.startswith("g:"):
            return blob_id(read_regular(path), hash_name) == digest[2:]
        if digest[:2] in ("s:", "b:"):
            return file_digest(path) == digest[2:]
        if digest.startswith("l:"):
            return os.readlink(path) == digest[2:]
    except (OSError, zlib.error):
        return False
    return False


@dataclass
class Diff:
    """How a tree differs from its snapshot (relative paths, sorted)."""

    extra: list[str] = field(default_factory=list)  # not in the snapshot
    missing: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # kind, metadata or content
    caches: list[str] = field(default_factory=list)  # extra or changed under __pycache__
    # Files whose fingerprint moved but whose content was checked equal:
    # (rel, new entry), for the caller's "verified since" memory.
    rechecked: list[tuple[str, Entry]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.extra or self.missing or self.changed)


def unchanged(old: Entry, new: Entry) -> bool | None:
    """True/False when the fingerprints decide; None when content must be compared."""
    if old[0] != new[0] or old[2:4] != new[2:4]:
        return False  # kind or owner
    kind = old[0]
    if kind == DIR:
        return old[1] == new[1]  # entries added and removed move a dir's times
    if kind == LINK:
        return None if old[6:8] != new[6:8] else True
    if old[1] != new[1] or old[4] != new[4]:
        return False  # mode or size
    if old[5:8] == new[5:8]:
        return True
    return None if kind == FILE else False


def compare(
    root: str,
    entries: dict[str, Entry],
    hash_name: str,
    skip: frozenset[tuple[int, int]],
    limit: int,
    known: dict[str, Entry] | None = None,
) -> Diff:
    """Walk ``root`` and compare with ``entries``. ``known`` maps paths to
    fingerprints already checked to hold the recorded content (an earlier
    reset rewrote them); their fingerprint counts as the recorded one."""
    diff = Diff()
    seen: set[str] = set()
    # A new directory is deleted whole: what is in it need not be listed.
    try:
        tree = walk(root, skip, limit, descend=entries.__contains__)
        first = next(tree)
    except FileNotFoundError:
        tree, first = iter(()), None
    for rel, st in itertools.chain([first] if first else [], tree):
        seen.add(rel)
        new = entry_of(st)
        old = entries.get(rel)
        if old is None:
            (diff.caches if is_cache(rel) else diff.extra).append(rel)
            continue
        prior = (known or {}).get(rel)
        verdict = unchanged(old, new)
        if verdict is None and prior is not None and prior[:8] == new[:8]:
            verdict = True
        if verdict is None:
            verdict = bool(old[8]) and same_content(join(root, rel), old[8], hash_name)
            if verdict:
                diff.rechecked.append((rel, new))
        if not verdict:
            (diff.caches if is_cache(rel) else diff.changed).append(rel)
    for rel in entries:
        if rel not in seen and not is_cache(rel):
            diff.missing.append(rel)
    diff.missing.sort()
    return diff


def top_level(paths: list[str]) -> list[str]:
    """The paths none of whose parents is in the list (delete those only)."""
    wanted = set(paths)
    out = []
    for p in sorted(paths):
        parts = p.split("/")
        if not any("/".join(parts[:i]) in wanted for i in range(1, len(parts))):
            out.append(p)
    return out


def describe(diff: Diff, label: str, limit: int = 3) -> list[str]:
    """Drift lines for a report."""
    out = []
    for what, paths in (
        ("changed", diff.changed),
        ("missing", diff.missing),
        ("not in the pristine state", diff.extra),
    ):
        if paths:
            shown = ", ".join(paths[:limit]) + (", ..." if len(paths) > limit else "")
            out.append(f"{label}: {len(paths)} {what}: {shown}")
    return out
