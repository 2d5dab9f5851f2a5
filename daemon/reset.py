"""/v1/reset: put a used sandbox back into the state it started in, and prove it.

A sandbox reused for another rollout must not leak the previous rollout's
edits, files, processes or git history into the next reward. Reset kills
every process, restores the recorded trees (``survey``, ``restore``) and
empties the temp dirs, then verifies independently of what it did: every
recorded tree is compared with the record again by fingerprint and content.
Anything it could not restore or verify is drift, and a sandbox with drift
must be replaced, never reused.

Reset runs no program from the image (no git, no shell): all of it is file
system work in the daemon, in its thread pool (the event loop, and /healthz
with it, stays responsive during a reset of a big tree).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandman.daemon.children import ChildReaper, descendants
from sandman.daemon.firstuse import record_path, skip_ids
from sandman.daemon.gitread import ObjectStore
from sandman.daemon.pristine import Pristine, Record
from sandman.daemon.restore import remove, restore_tree
from sandman.daemon.snapshot import DIR, Diff, TooLarge, compare, describe, top_level
from sandman.daemon.survey import MAX_WORKSPACE_ENTRIES

if TYPE_CHECKING:
    from sandman.daemon.state import DaemonState

log = logging.getLogger("sandmand")

# How long killed processes get to disappear before reset calls them drift.
KILL_SETTLE_S = 2.0
# A tree is walked with room for what an agent added (twice the recorded
# maximum); beyond that it is drift ("cannot verify"), not a slower reset.
WALK_LIMIT = 2 * MAX_WORKSPACE_ENTRIES


# -- processes ----------------------------------------------------------------------
def _ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    out.add(1)
    return out


def owns_pid_namespace() -> bool:
    """True when PID 1 is the daemon's own chain (it is the sandbox's init).

    Then reset may kill every other process in the namespace, including ones
    started by `kubectl exec`, which are not our descendants. Anywhere else
    (a developer's host, the test suite) only our descendants are ours.
    """
    try:
        argv0 = Path("/proc/1/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return os.path.basename(argv0) == b"sandmand" or os.getpid() == 1


def foreign_processes() -> list[int]:
    """The processes reset kills: every live process of the sandbox except
    PID 1, the daemon and its ancestors."""
    if owns_pid_namespace():
        keep = _ancestors()
        candidates = [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) not in keep]
    else:
        candidates = descendants(os.getpid())
    out = []
    for pid in candidates:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out


# -- temp dirs ----------------------------------------------------------------------
def _kept(real: str, keep_real: set[str]) -> bool:
    return any(real == k or k.startswith(real.rstrip("/") + "/") for k in keep_real)


def clear_dir(d: Path, keep: tuple[Path, ...]) -> list[str]:
    """Remove a temp dir's contents (not the dir), sparing what holds ``keep``."""
    failed = []
    keep_real = {os.path.realpath(k) for k in keep}
    try:
        entries = list(os.scandir(d))
    except FileNotFoundError:
        return []
    for e in entries:
        if _kept(os.path.realpath(e.path), keep_real):
            continue
        try:
            remove(e.path)
        except OSError as err:
            failed.append(f"{e.path}: {err.strerror}")
    return failed


def leftovers(d: Path, keep: tuple[Path, ...]) -> list[str]:
    keep_real = {os.path.realpath(k) for k in keep}
    try:
        return [e.path for e in os.scandir(d) if not _kept(os.path.realpath(e.path), keep_real)]
    except FileNotFoundError:
        return []


# -- reset ------------------------------------------------------------------------------
@dataclass
class ResetReport:
    clean: bool
    drift: list[str]
    actions: list[str]
    duration_ms: float
    pristine: dict[str, Any] | None = field(default=None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _split(diff: Diff, prefix: str) -> tuple[Diff, Diff]:
    """(the part of a diff under ``prefix``, the rest)."""

    def under(rel: str) -> bool:
        return rel == prefix or rel.startswith(prefix + "/")

    a, b = Diff(), Diff()
    for name in ("extra", "missing", "changed", "caches"):
        items = getattr(diff, name)
        getattr(a, name).extend(x for x in items if under(x))
        getattr(b, name).extend(x for x in items if not under(x))
    return a, b


def _restore_and_verify(
    pristine: Pristine, skip: frozenset[tuple[int, int]]
) -> tuple[list[str], list[str]]:
    """(actions, drift): restore the trees that are restored, clean caches in
    the others, then compare every tree with the record again."""
    rec = pristine.record()
    actions: list[str] = []
    drift: list[str] = list(rec.notes)
    store: ObjectStore | None = None

    def objects() -> ObjectStore | None:
        nonlocal store
        if store is None and rec.objects_dir:
            store = ObjectStore(Path(rec.objects_dir), rec.hash_name)
        return store

    try:
        # Repository first (a repository outside the workspace, then the
        # workspace's .git), so blobs are read from the pristine object store.
        ordered = sorted(rec.trees, key=lambda t: (t.name != "git", t.name))
        untouched: dict[str, Diff] = {}  # trees found as recorded: nothing to redo
        for t in ordered:
            known = pristine.known.get(t.root)
            try:
                diff = compare(t.root, t.entries, rec.hash_name, skip, WALK_LIMIT, known)
            except TooLarge as e:
                drift.append(f"{t.name} {t.root} cannot be verified: {e}")
                untouched[t.root] = Diff()
                continue
            if diff.clean and not diff.caches:
                untouched[t.root] = diff
                continue
            if t.restore:
                repo = _repo_prefix(rec, t)
                if t.name == "git":
                    repo_part, rest = diff, Diff()
                elif repo:
                    repo_part, rest = _split(diff, repo)
                else:
                    repo_part, rest = Diff(), diff
                moved, repo_part = _loose_objects(repo_part, t)
                done, failures = 0, []
                if moved.missing or moved.changed:
                    # git's automatic gc packs loose objects and deletes them:
                    # write them again from wherever they are now, before the
                    # new pack (not in the record) is deleted below.
                    with contextlib.closing(
                        ObjectStore(Path(rec.objects_dir), rec.hash_name)
                    ) as now:
                        done, failures = restore_tree(t, moved, rec, now)
                n, f = restore_tree(t, repo_part, rec, None)
                done, failures = done + n, failures + f
                n, f = restore_tree(t, rest, rec, objects())
                done, failures = done + n, failures + f
                if done:
                    actions.append(f"restored {done} entr{'y' if done == 1 else 'ies'} of {t.root}")
                drift += failures[:20]
            elif diff.caches:
                for rel in top_level(diff.caches):
                    with contextlib.suppress(OSError):
                        remove(os.path.join(t.root, rel))
                actions.append(f"removed {len(diff.caches)} changed bytecode cache(s) in {t.root}")
        # Verify, independently of what the steps above reported (a tree the
        # first comparison found as recorded, with every process already
        # gone, is not walked twice).
        for t in rec.trees:
            known = pristine.known.setdefault(t.root, {})
            if t.root in untouched:
                known.update(untouched[t.root].rechecked)
                continue
            try:
                diff = compare(t.root, t.entries, rec.hash_name, skip, WALK_LIMIT, known)
            except TooLarge as e:
                drift.append(f"{t.name} {t.root} cannot be verified: {e}")
                continue
            known.update(diff.rechecked)
            drift += describe(diff, f"{t.name} {t.root}")
    finally:
        if store is not None:
            store.close()
    return actions, drift


def _loose_objects(diff: Diff, tree: Any) -> tuple[Diff, Diff]:
    """(missing or changed loose objects and their fan-out directories, the
    rest of the diff)."""
    moved, rest = Diff(), Diff(extra=diff.extra, caches=diff.caches)
    for name in ("missing", "changed"):
        for rel in getattr(diff, name):
            entry = tree.entries[rel]
            fanout = (
                entry[0] == DIR and "/objects/" in f"/{rel}" and len(rel.rsplit("/", 1)[-1]) == 2
            )
            getattr(moved if entry[8] == "o:" or fanout else rest, name).append(rel)
    return moved, rest


def _repo_prefix(rec: Record, tree: Any) -> str | None:
    """The repository's path inside the workspace tree ('.git'), if it is there."""
    if tree.name != "workspace" or not rec.git_dir or not rec.workspace:
        return None
    rel = os.path.relpath(os.path.realpath(rec.git_dir), os.path.realpath(rec.workspace))
    return None if rel.startswith("..") else rel


async def reset(st: DaemonState) -> ResetReport:
    t0 = time.monotonic()
    loop = asyncio.get_running_loop()
    reaper: ChildReaper = st.reaper
    actions: list[str] = []
    drift: list[str] = []

    # 1. Processes: everything but PID 1 and the daemon's own chain. MUST come
    # first: a process left running could change a tree after it was restored.
    victims = foreign_processes()
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if victims:
        actions.append(f"killed {len(victims)} process(es)")
    deadline = time.monotonic() + KILL_SETTLE_S
    while foreign_processes() and time.monotonic() < deadline:
        reaper.reap()
        await asyncio.sleep(0.02)

    pristine = st.pristine
    skip = skip_ids(st)
    # Never emptied with a temp dir: the daemon's dir, and whatever the
    # daemon was told to restore or verify (even when its record is lost).
    keep: tuple[Path, ...] = (st.config.daemon_dir, *st.config.manifest_files)
    if st.config.workspace is not None:
        keep += (st.config.workspace,)
    if pristine is not None and pristine.invalid:
        drift.append(
            f"{pristine.invalid}; this sandbox's pristine state cannot be verified: replace it"
        )
    elif pristine is not None:
        if pristine.pending is not None:
            await pristine.pending  # the packs' digests, hashed after start-up
        # 2. The record on disk must still be the one in memory.
        line = await loop.run_in_executor(
            None, pristine.check_disk, record_path(st), st.pristine_key
        )
        if line:
            drift.append(line)
        rec_roots = tuple(Path(t.root) for t in pristine.record().trees)
        keep += rec_roots

    # 3. Temp dirs (sparing recorded trees and the daemon's dir inside them).
    def clear() -> list[str]:
        return [f"temp not cleared: {f}" for d in st.config.temp_dirs for f in clear_dir(d, keep)]

    drift += await loop.run_in_executor(None, clear)
    actions.append(f"cleared {', '.join(map(str, st.config.temp_dirs))}")

    # 4. Restore the recorded trees and verify every one of them.
    if pristine is not None and not pristine.invalid:
        done, found = await loop.run_in_executor(None, _restore_and_verify, pristine, skip)
        actions += done
        drift += found

    # 5. Nothing may have survived, and the temp dirs stay empty.
    left = foreign_processes()
    if left:
        drift.append(f"{len(left)} process(es) survived: pids {left[:10]}")
    for d in st.config.temp_dirs:
        extra = await loop.run_in_executor(None, leftovers, d, keep)
        if extra:
            drift.append(f"{d} not empty: {extra[:3]}")
    info = pristine.info() if pristine is not None else None
    return ResetReport(not drift, drift, actions, (time.monotonic() - t0) * 1000, info)
