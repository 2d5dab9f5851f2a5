"""First use: load the pristine record a previous run left, or take it now.

Runs once at start-up, before the daemon listens (server.App.startup). Kept
apart from reset's modules so that an image with nothing to record (no
workspace, no named files, no Python) imports none of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hashlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sandman.daemon.pristine import RECORD_FILE, Pristine, Record, load, record_key

if TYPE_CHECKING:
    from sandman.daemon.state import DaemonState

log = logging.getLogger("sandmand")

# Where images keep Python: system, /usr/local (python:* images), conda and
# venvs under /opt, user installs, and venvs at the root.
PYTHON_GLOBS = (
    "/usr/lib/python3*",
    "/usr/local/lib/python3*",
    "/opt/*/lib/python3*",
    "/opt/*/envs/*/lib/python3*",
    "/root/.local/lib/python3*",
    "/home/*/.local/lib/python3*",
    "/venv/lib/python3*",
    "/.venv/lib/python3*",
)


def python_dirs() -> tuple[Path, ...]:
    found = set()
    for pattern in PYTHON_GLOBS:
        for p in glob.glob(pattern):
            if os.path.isdir(p) and not os.path.islink(p):
                found.add(os.path.realpath(p))
    return tuple(Path(p) for p in sorted(found))


def skip_ids(st: DaemonState) -> frozenset[tuple[int, int]]:
    """The daemon's own dir, by identity: never recorded, restored or removed."""
    out = set()
    for p in (st.config.daemon_dir,):
        with contextlib.suppress(OSError):
            s = os.stat(p)
            out.add((s.st_dev, s.st_ino))
    return frozenset(out)


def record_path(st: DaemonState) -> Path:
    return st.config.daemon_dir / RECORD_FILE


async def prepare(st: DaemonState, workspace: Path | None) -> Pristine | None:
    """At start-up, before serving: the record a previous run left (a restart),
    else a new one. None when there is nothing to record."""
    cfg = st.config
    st.pristine_key = record_key(cfg.token_sha256)
    pythons = python_dirs() if cfg.python_dirs is None else cfg.python_dirs
    path = record_path(st)
    loop = asyncio.get_running_loop()
    found = await loop.run_in_executor(None, load, path, st.pristine_key)
    if found is not None:
        if found.invalid:
            log.warning("pristine record not trusted: %s", found.invalid)
        elif found.has_deferred:
            # The previous run died before hashing them: what they held at
            # first use is unknown now.
            found.replace(finish_deferred(found.record(), hashed=False))
            await loop.run_in_executor(None, found.save, path, st.pristine_key)
        return found
    if workspace is None and not cfg.manifest_files and not pythons:
        return None
    from sandman.daemon.survey import take

    rec = await take(st.reaper, st.base_env, workspace, cfg.manifest_files, pythons, skip_ids(st))
    pristine = Pristine.of(rec)
    try:
        await loop.run_in_executor(None, pristine.save, path, st.pristine_key)
    except OSError as e:
        log.warning("cannot persist the pristine record to %s: %s", path, e)
    log.info(
        "pristine record taken: %d tree(s), %d entries, %d file(s) to hash in the background",
        len(rec.trees),
        sum(len(t.entries) for t in rec.trees),
        len(rec.deferred),
    )
    if rec.deferred:
        pristine.pending = asyncio.ensure_future(_finish(pristine, rec, path, st.pristine_key))
    return pristine


async def _finish(pristine: Pristine, rec: Record, path: Path, key: bytes) -> None:
    """Hash the deferred files (packs) after start-up; reset waits for it."""
    loop = asyncio.get_running_loop()
    try:
        done = await loop.run_in_executor(None, finish_deferred, rec)
    except Exception:  # then those files stay without a digest: a change is drift
        log.exception("hashing the pristine record's packs failed")
        return
    pristine.replace(done)
    try:
        await loop.run_in_executor(None, pristine.save, path, key)
    except OSError as e:
        log.warning("cannot persist the completed pristine record to %s: %s", path, e)


def finish_deferred(rec: Record, hashed: bool = True) -> Record:
    """Fill in the digests left for later (synchronous: run it in a thread).

    A file is hashed only if it still has its recorded fingerprint before and
    after the read (else it changed in between, and its digest is "x:",
    unknown). ``hashed=False`` marks them all unknown (a restarted daemon
    cannot know what they held at first use).
    """
    from sandman.daemon.snapshot import entry_of, join

    trees = {t.root: t for t in rec.trees}
    for root, rel in rec.deferred:
        t = trees.get(root)
        if t is None or rel not in t.entries:
            continue
        entry = t.entries[rel]
        digest = "x:"
        if hashed:
            try:
                fd = os.open(join(root, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                fd = -1
            if fd >= 0:
                try:
                    if entry_of(os.fstat(fd))[:8] == entry[:8]:
                        h = hashlib.blake2b(digest_size=20)
                        while chunk := os.read(fd, 1 << 20):
                            h.update(chunk)
                        if entry_of(os.fstat(fd))[:8] == entry[:8]:
                            digest = "b:" + h.hexdigest()
                except OSError:
                    pass
                finally:
                    os.close(fd)
        t.entries[rel] = (*entry[:8], digest)  # type: ignore[assignment]
    rec.deferred = []
    return rec
