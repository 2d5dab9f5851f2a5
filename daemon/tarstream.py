"""Tar upload (extract into a dir) and download (archive a path), streamed.

Both sides are synchronous (tarfile, ``tarwrite``), so each transfer runs in a
worker thread connected to the event loop by a bounded queue (backpressure
both ways). Extraction validates every member itself: the interpreter we
freeze (Debian's 3.11.2) predates tarfile's extraction filters.

A download that fails after its 200 went out (a file vanished or shrank
while it was archived) cannot change its status any more. Its end is then
made unmistakable: the last chunk is an error record (``STREAM_ERROR_MARKER``
and a JSON ``{"code", "message"}`` line, for the SDK to report) and the
connection is closed without the terminating chunk, so every HTTP client
(curl, requests, aiohttp, http.client) raises instead of keeping a
truncated archive that looks whole. A failure before anything was sent is an
ordinary JSON error.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import queue
import stat
import tarfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandman.contract import STREAM_ERROR_MARKER
from sandman.daemon.errors import APIError, BadRequest, NotFound, PayloadTooLarge
from sandman.daemon.files import os_errors
from sandman.daemon.paths import PathPolicy
from sandman.daemon.tarwrite import CHUNK, ArchiveError, Archiver

log = logging.getLogger("sandmand")

QUEUE_DEPTH = 16  # chunks in flight between loop and thread: 4 MiB of memory
# A pax or GNU long-name header is read into memory whole: real ones are a
# few hundred bytes (a path and a few times), so 1 MiB is generous, and a
# header claiming gigabytes cannot make the daemon allocate them.
MAX_META_BYTES = 1 << 20
# tarfile keeps every member it has read; extraction forgets them as it goes,
# so memory stays flat, but one upload still gets at most this many members
# (a million empty files is a 512 MiB tar, far beyond any workspace).
MAX_MEMBERS = 1_000_000


class StreamAborted(APIError):
    """A streamed response failed after it started: the connection is cut."""


def error_record(code: str, message: str) -> bytes:
    """The last chunk of an aborted stream (see the module docstring)."""
    return STREAM_ERROR_MARKER + json.dumps({"code": code, "message": message}).encode() + b"\n"


class _QueueReader(io.RawIOBase):
    """A file-like view of chunks the event loop puts into a queue."""

    def __init__(self) -> None:
        self.q: queue.Queue[bytes | None] = queue.Queue(maxsize=QUEUE_DEPTH)
        self._buf = b""
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        while not self._buf and not self._eof:
            chunk = self.q.get()
            if chunk is None:
                self._eof = True
            else:
                self._buf = chunk
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


# Member kinds whose data tarfile reads into memory whole.
_META_TYPES = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)


class _SafeTarInfo(tarfile.TarInfo):
    """Refuses the member kinds whose metadata tarfile would read into memory
    whole (pax, GNU long names) beyond MAX_META_BYTES, and sparse members
    (whose declared size has no bound)."""

    def _proc_member(self, tar: Any) -> Any:
        if self.type in _META_TYPES and self.size > MAX_META_BYTES:
            raise BadRequest(
                f"tar header block of {self.size} bytes (at most {MAX_META_BYTES})", code="bad_tar"
            )
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise BadRequest("sparse tar members are not supported", code="bad_tar")
        return super()._proc_member(tar)

    def _proc_gnusparse_10(self, *args: Any) -> Any:
        raise BadRequest("sparse tar members are not supported", code="bad_tar")


@dataclass
class ExtractStats:
    files: int = 0
    dirs: int = 0
    links: int = 0
    bytes: int = 0


def _member_target(policy: PathPolicy, root: Path, name: str) -> Path:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts:
        raise BadRequest(f"tar member {name!r} escapes the target directory", code="bad_tar")
    if not parts:
        return root
    # Resolve through anything extracted so far (a symlink member must not
    # become a way out of the allowed roots).
    return policy.entry(str(root.joinpath(*parts)))


def _extract_one(
    policy: PathPolicy,
    root: Path,
    tar: tarfile.TarFile,
    m: tarfile.TarInfo,
    stats: ExtractStats,
    limit: int,
) -> None:
    target = _member_target(policy, root, m.name)
    mode = stat.S_IMODE(m.mode) & ~(stat.S_ISUID | stat.S_ISGID)
    if m.isdir():
        target.mkdir(parents=True, exist_ok=True)
        os.chmod(target, mode | stat.S_IRWXU)
        stats.dirs += 1
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(target) and not stat.S_ISDIR(os.lstat(target).st_mode):
        os.unlink(target)  # never write through an existing symlink
    if m.isfile():
        src = tar.extractfile(m)
        assert src is not None
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as out:
            while chunk := src.read(CHUNK):
                stats.bytes += len(chunk)
                if stats.bytes > limit:
                    raise PayloadTooLarge(f"the tar unpacks to more than {limit} bytes")
                out.write(chunk)
        os.utime(target, (m.mtime, m.mtime))
        stats.files += 1
    elif m.issym():
        link_to = m.linkname
        resolved = link_to if link_to.startswith("/") else str(target.parent / link_to)
        policy.target(os.path.normpath(resolved))  # must stay inside the rules
        os.symlink(link_to, target)
        stats.links += 1
    elif m.islnk():
        source = _member_target(policy, root, m.linkname)
        os.link(source, target, follow_symlinks=False)
        stats.links += 1
    else:
        raise BadRequest(
            f"tar member {m.name!r} is a device or fifo; only files, dirs and links",
            code="bad_tar",
        )


def extract_worker(
    policy: PathPolicy, root: Path, reader: _QueueReader, limit: int = 8 << 30
) -> ExtractStats:
    stats = ExtractStats()
    try:
        with tarfile.open(fileobj=reader, mode="r|*", tarinfo=_SafeTarInfo) as tar:  # type: ignore[call-overload]
            count = 0
            while (m := tar.next()) is not None:
                tar.members.clear()  # stream mode keeps every member otherwise
                count += 1
                if count > MAX_MEMBERS:
                    raise PayloadTooLarge(f"more than {MAX_MEMBERS} members in one tar")
                with os_errors(f"tar member {m.name!r}"):
                    _extract_one(policy, root, tar, m, stats, limit)
    except (tarfile.TarError, EOFError) as e:
        raise BadRequest(f"not a valid tar stream: {e}", code="bad_tar") from None
    except (ValueError, UnicodeError) as e:
        raise BadRequest(f"not a valid tar stream: {e}", code="bad_tar") from None
    finally:
        # Drain whatever the loop still sends so it never blocks on a full queue.
        while not reader._eof:
            if reader.q.get() is None:
                reader._eof = True
    return stats


async def extract(
    policy: PathPolicy, raw_dir: object, chunks: AsyncIterator[bytes], limit: int
) -> ExtractStats:
    root = policy.target(raw_dir)
    if not root.is_dir():
        raise BadRequest(f"{root} is not a directory (create it first, or pass mkdirs)")
    reader = _QueueReader()
    loop = asyncio.get_running_loop()
    work = loop.run_in_executor(None, extract_worker, policy, root, reader, limit)
    total = 0
    try:
        async for chunk in chunks:
            total += len(chunk)
            if total > limit:
                raise BadRequest(f"upload larger than {limit} bytes", code="too_large")
            if work.done():
                break  # the worker failed; its error is reported below
            await loop.run_in_executor(None, reader.q.put, chunk)
    finally:
        await loop.run_in_executor(None, reader.q.put, None)
    return await work


# -- download ---------------------------------------------------------------------
class _Feed:
    """Carries the worker's output to the event loop: bytes, then None (done)
    or the exception that ended it. ``put`` blocks while the queue is full."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.q: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(maxsize=QUEUE_DEPTH)
        self.cancelled = threading.Event()

    def put(self, item: bytes | BaseException | None) -> None:
        if self.cancelled.is_set():
            raise BrokenPipeError("client went away")
        asyncio.run_coroutine_threadsafe(self.q.put(item), self.loop).result()


def _protected_ids(policy: PathPolicy) -> frozenset[tuple[int, int]]:
    ids = set()
    for p in policy.protected:
        try:
            st = os.stat(p)
        except OSError:
            continue
        ids.add((st.st_dev, st.st_ino))
    return frozenset(ids)


async def archive(policy: PathPolicy, raw: object, gzip: bool) -> AsyncIterator[bytes]:
    """Yield a tar (optionally gzip) of a file or directory tree.

    Errors before the first chunk raise as API errors (a JSON answer); later
    ones yield the error record, then raise StreamAborted (the handler's
    stream is cut; see the module docstring).
    """
    path = policy.target(raw)
    if not os.path.lexists(path):
        raise NotFound(f"{path}: no such file or directory")
    loop = asyncio.get_running_loop()
    feed = _Feed(loop)
    skip = _protected_ids(policy)

    def work() -> None:
        try:
            arc = Archiver(feed.put, gzip=gzip, skip=skip)
            arc.add(str(path), path.name or "root")
            arc.finish()
        except BrokenPipeError:
            return
        except ArchiveError as e:
            feed.put(e)
            return
        except Exception as e:  # a bug: reported as one, never as a whole archive
            log.exception("archiving %s failed", path)
            feed.put(e)
            return
        feed.put(None)

    fut = loop.run_in_executor(None, work)
    sent = False
    try:
        while True:
            item = await feed.q.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                err = _api_error(item)
                if not sent:
                    raise err
                log.warning("tar of %s aborted mid-stream: %s", path, err.message)
                yield error_record(err.code, err.message)
                raise StreamAborted(err.message, code=err.code)
            sent = True
            yield item
    finally:
        feed.cancelled.set()
        while not fut.done():  # unblock a worker waiting on a full queue
            try:
                feed.q.get_nowait()
            except asyncio.QueueEmpty:
                await asyncio.sleep(0.01)


def _api_error(e: BaseException) -> APIError:
    if not isinstance(e, ArchiveError):
        return APIError("internal error (logged by the daemon)")
    err = APIError(e.message, code=e.code)
    err.status = e.status
    return err
