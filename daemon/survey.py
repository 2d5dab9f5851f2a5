"""Take the pristine record at first use: the workspace, named files, Python.

Three kinds of trees are recorded:

- the workspace (a git checkout, with its repository): restored by reset.
  Tracked files that match the index are recorded by blob id (reset rewrites
  them from the object store, checking each blob against its id); small
  files git cannot restore (untracked build outputs such as ``*.egg-info``,
  tracked files that differ from the index) are copied into the record, and
  so is the repository's metadata outside ``objects/`` (config, hooks, HEAD,
  refs, index, ...), so reset can put every byte of it back;
- the files a pod names (``sandman.dev/manifests``, ``--manifest``):
  verified by content (BLAKE2b), never restored;
- the image's Python installations (``lib/python3*`` under the usual
  prefixes), when it has any: verified by fingerprint (a planted
  ``sitecustomize.py``, an edited ``_pytest`` or a ``pip install`` all show),
  never restored, except that new or changed ``__pycache__`` files are
  deleted (they are caches).
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sandman.daemon import gitsafe
from sandman.daemon.children import ChildReaper
from sandman.daemon.gitindex import (
    GitReadError,
    IndexEntry,
    common_dir,
    git_dir_of,
    hash_name,
    read_head,
    read_index,
)
from sandman.daemon.gitread import MAX_BLOB_BYTES, blob_id
from sandman.daemon.pristine import Record, TreeRecord
from sandman.daemon.snapshot import (
    FILE,
    LINK,
    Entry,
    TooLarge,
    content_digest,
    entry_of,
    file_digest,
    join,
    read_regular,
    walk,
)

# Entries a tree may have. Each costs ~150 bytes in the (compressed) record
# and one lstat per reset: a million is a very large monorepo checkout.
MAX_WORKSPACE_ENTRIES = 1_000_000
# A conda env with PyTorch and friends has ~100k files; beyond this a Python
# tree is left unchecked (and the record says so) rather than slow every reset.
MAX_PYTHON_ENTRIES = 300_000
MAX_MANIFEST_ENTRIES = 100_000
# Copies kept in the record (memory, compressed): repository metadata files
# up to 4 MiB (the index up to 64 MiB: a 100k-file checkout's is ~10 MiB),
# untracked files up to 64 KiB; at most 128 MiB in all.
MAX_SAVED_FILE = 4 << 20
MAX_SAVED_INDEX = 64 << 20
MAX_SAVED_UNTRACKED = 64 << 10
MAX_SAVED_TOTAL = 128 << 20
# Packs are hashed after start-up, in the background (git "freshens" a pack,
# moving its ctime, whenever an object in it is written again, so a pack's
# fingerprint alone cannot vouch for it): ~10 s of one core at most.
MAX_DEFERRED_BYTES = 2 << 30
# Attribute words that make a checked-out file differ from its blob (a
# filter driver, CRLF line ends, $Id$ expansion, re-encoding). With any of
# them in the repository's attribute files, git's "clean" view cannot be
# used, and filter drivers are programs: then files are hashed natively.
CONVERTING = (b"filter", b"crlf", b"ident", b"working-tree-encoding")


def _metadata(rel: str) -> bool:
    """A repository file that is not object storage (and so is copied)."""
    parts = rel.split("/")
    if parts[:2] == ["objects", "info"]:
        return True  # alternates, packs list, commit-graph: small, rewritten by git
    return "objects" not in parts and "lfs" not in parts


def _loose_object(rel: str) -> bool:
    """objects/ab/cdef...: its content hashes to its own name."""
    parts = rel.split("/")
    return (
        len(parts) >= 3
        and parts[-3] == "objects"
        and len(parts[-2]) == 2
        and len(parts[-2]) + len(parts[-1]) in (40, 64)
        and all(c in "0123456789abcdef" for c in parts[-2] + parts[-1])
    )


@dataclass
class _Saver:
    saved: dict[str, bytes] = field(default_factory=dict)
    total: int = 0
    deferred: list[tuple[str, str]] = field(default_factory=list)  # (tree root, rel)
    deferred_bytes: int = 0

    def keep(self, data: bytes) -> str:
        h = content_digest(data)
        if h not in self.saved:
            self.saved[h] = data
            self.total += len(data)
        return "s:" + h

    def room(self, size: int, cap: int) -> bool:
        return size <= cap and self.total + size <= MAX_SAVED_TOTAL

    def defer(self, root: str, rel: str, size: int) -> None:
        if self.deferred_bytes + size <= MAX_DEFERRED_BYTES:
            self.deferred.append((root, rel))
            self.deferred_bytes += size


@dataclass
class _Workspace:
    root: Path
    git_dir: Path | None
    inside: str | None  # the repository's path relative to root, if inside
    hash_name: str
    index: dict[str, IndexEntry]
    converting: bool
    tree: list[tuple[str, Entry]]  # entries without digests yet
    git_tree: list[tuple[str, Entry]]  # a repository outside the root
    notes: list[str]


def _scan(ws: Path, skip: frozenset[tuple[int, int]]) -> _Workspace:
    notes: list[str] = []
    git_dir = git_dir_of(ws)
    index: dict[str, IndexEntry] = {}
    name = "sha1"
    if git_dir is not None:
        name = hash_name(git_dir)
        try:
            index = {e.path: e for e in read_index(git_dir / "index", name)}
        except FileNotFoundError:
            pass
        except (OSError, GitReadError) as e:
            notes.append(f"the workspace's git index could not be read at first use ({e})")
    tree = [(rel, entry_of(st)) for rel, st in walk(str(ws), skip, MAX_WORKSPACE_ENTRIES)]
    inside = None
    git_tree: list[tuple[str, Entry]] = []
    if git_dir is not None:
        real = os.path.realpath(git_dir)
        if real.startswith(os.path.realpath(ws).rstrip("/") + "/"):
            inside = os.path.relpath(real, os.path.realpath(ws))
        else:
            git_tree = [(r, entry_of(st)) for r, st in walk(real, skip, MAX_WORKSPACE_ENTRIES)]
    attr_files = [rel for rel, _ in tree if rel.endswith(".gitattributes")]
    if inside:
        attr_files.append(f"{inside}/info/attributes")
    converting = False
    for rel in attr_files:
        try:
            text = read_regular(join(str(ws), rel), 1 << 20).lower()
        except OSError:
            continue
        converting = converting or any(w in text for w in CONVERTING)
    if git_dir is not None:
        try:
            config = read_regular(str(common_dir(git_dir) / "config"), 1 << 20).lower()
            converting = converting or b"autocrlf = true" in config or b"eol = crlf" in config
        except OSError:
            pass
    return _Workspace(ws, git_dir, inside, name, index, converting, tree, git_tree, notes)


def _file_digest(
    path: str,
    size: int,
    tracked: IndexEntry | None,
    known_clean: bool,
    saver: _Saver,
    hash_name_: str,
) -> str:
    """What to record of a worktree file's content (see snapshot's docstring)."""
    if tracked is not None and (tracked.mode >> 12) == 0o10:
        if known_clean:
            return "g:" + tracked.oid  # git says it matches the index
        if size <= MAX_BLOB_BYTES:
            data = read_regular(path)
            if blob_id(data, hash_name_) == tracked.oid:
                return "g:" + tracked.oid
            if saver.room(len(data), MAX_SAVED_UNTRACKED):
                return saver.keep(data)
        return "b:" + file_digest(path)
    if saver.room(size, MAX_SAVED_UNTRACKED):
        return saver.keep(read_regular(path))
    return ""


def _digest_or_nothing(fn: Callable[[], str]) -> str:
    try:
        return fn()
    except OSError:  # unreadable (a non-root daemon): its fingerprint still counts
        return ""


def _repo_entries(
    repo_root: str,
    tree: list[tuple[str, Entry]],
    prefix: str,
    saver: _Saver,
    tree_root: str,
) -> dict[str, Entry]:
    """A repository's files: metadata copied; loose objects vouch for
    themselves (their name is their hash); packs are hashed later."""
    out = {}
    for rel, e in tree:
        key = rel if not prefix else (prefix if rel == "." else f"{prefix}/{rel}")
        path = join(repo_root, rel)
        digest = ""
        if e[0] == LINK:
            digest = _digest_or_nothing(lambda p=path: "l:" + os.readlink(p))
        elif e[0] == FILE and _metadata(rel):
            cap = MAX_SAVED_INDEX if rel == "index" else MAX_SAVED_FILE
            if saver.room(e[4], cap):
                digest = _digest_or_nothing(lambda p=path: saver.keep(read_regular(p)))
            else:
                digest = _digest_or_nothing(lambda p=path: "b:" + file_digest(p))
        elif e[0] == FILE and _loose_object(rel):
            digest = "o:"
        elif e[0] == FILE:
            saver.defer(tree_root, key, e[4])
        out[key] = (*e[:8], digest)
    return out


def _workspace_tree(scan: _Workspace, dirty: set[str] | None, saver: _Saver) -> TreeRecord:
    ws = str(scan.root)
    entries: dict[str, Entry] = {}
    if scan.inside:
        repo = [(_strip(r, scan.inside), e) for r, e in scan.tree if _under(r, scan.inside)]
        entries = _repo_entries(join(ws, scan.inside), repo, scan.inside, saver, ws)
    for rel, e in scan.tree:
        if rel in entries:
            continue
        path = join(ws, rel)
        digest = ""
        if e[0] == FILE:
            tracked = scan.index.get(rel)
            clean = dirty is not None and rel not in dirty
            digest = _digest_or_nothing(
                lambda: _file_digest(path, e[4], tracked, clean, saver, scan.hash_name)  # noqa: B023
            )
        elif e[0] == LINK:
            digest = _digest_or_nothing(lambda: "l:" + os.readlink(path))  # noqa: B023
        entries[rel] = (*e[:8], digest)
    return TreeRecord("workspace", ws, True, entries)


def _build(
    scan: _Workspace | None,
    dirty: set[str] | None,
    manifests: tuple[Path, ...],
    pythons: tuple[Path, ...],
    skip: frozenset[tuple[int, int]],
    now: float,
) -> Record:
    rec = Record(recorded_at=now)
    saver = _Saver()
    if scan is not None:
        rec.workspace = str(scan.root)
        rec.notes += scan.notes
        if scan.git_dir is not None:
            rec.git_dir = str(scan.git_dir)
            rec.objects_dir = str(common_dir(scan.git_dir) / "objects")
            rec.hash_name = scan.hash_name
            rec.commit, rec.branch = read_head(scan.git_dir)
        rec.trees.append(_workspace_tree(scan, dirty, saver))
        if scan.git_tree:
            real = os.path.realpath(scan.git_dir)  # type: ignore[arg-type]
            rec.trees.append(
                TreeRecord("git", real, True, _repo_entries(real, scan.git_tree, "", saver, real))
            )
    for m in manifests:
        rec.trees.append(_verify_tree("manifest", m, skip, MAX_MANIFEST_ENTRIES, hashed=True))
    taken = [t.root for t in rec.trees]
    for p in pythons:
        if any(_under(str(p), t) or _under(t, str(p)) for t in taken):
            continue  # a venv inside the workspace is the workspace's
        rec.trees.append(_verify_tree("python", p, skip, MAX_PYTHON_ENTRIES, hashed=False))
    rec.saved = saver.saved
    rec.deferred = [list(d) for d in saver.deferred]
    for t in rec.trees:
        if t.note and t.name != "python":
            rec.notes.append(t.note)
    return rec


def _verify_tree(
    name: str, root: Path, skip: frozenset[tuple[int, int]], limit: int, hashed: bool
) -> TreeRecord:
    t = TreeRecord(name, str(root), False)
    try:
        for rel, st in walk(str(root), skip, limit):
            path = join(str(root), rel)
            digest = ""
            if hashed and stat.S_ISREG(st.st_mode):
                digest = _digest_or_nothing(lambda p=path: "b:" + file_digest(p))
            elif stat.S_ISLNK(st.st_mode):
                digest = _digest_or_nothing(lambda p=path: "l:" + os.readlink(p))
            t.entries[rel] = entry_of(st, digest)
    except FileNotFoundError:
        t.entries = {}  # recorded as absent: appearing later is drift
    except TooLarge as e:
        t.entries = {}
        t.note = f"{name} {root} not checked: {e}"
    return t


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _strip(rel: str, prefix: str | None) -> str:
    if not prefix or rel == prefix:
        return "."
    return rel[len(prefix) + 1 :]


async def take(
    reaper: ChildReaper,
    base_env: Mapping[str, str],
    workspace: Path | None,
    manifests: tuple[Path, ...],
    pythons: tuple[Path, ...],
    skip: frozenset[tuple[int, int]],
    clock: Callable[[], float] = time.time,
) -> Record:
    """The record of this sandbox as it is now (call before serving anything)."""
    loop = asyncio.get_running_loop()
    scan = None
    dirty: set[str] | None = None
    if workspace is not None and not workspace.is_dir():
        rec = await loop.run_in_executor(
            None, _build, None, None, manifests, pythons, skip, clock()
        )
        rec.workspace = str(workspace)
        rec.notes.append(f"the workspace {workspace} was not a directory at first use")
        return rec
    if workspace is not None:
        try:
            scan = await loop.run_in_executor(None, _scan, workspace, skip)
        except TooLarge as e:
            rec = Record(recorded_at=clock(), workspace=str(workspace))
            rec.notes.append(f"the workspace cannot be verified: {e}")
            return rec
        if scan.git_dir is not None and scan.index and not scan.converting:
            dirty = await gitsafe.dirty_files(reaper, base_env, scan.git_dir, workspace)
    return await loop.run_in_executor(None, _build, scan, dirty, manifests, pythons, skip, clock())
