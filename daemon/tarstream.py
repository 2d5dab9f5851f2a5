"""Tar upload (extract into a dir) and download (archive a path), streamed.

tarfile is synchronous, so each transfer runs in a worker thread connected to
the event loop by a bounded queue (backpressure both ways). Extraction
validates every member itself: the interpreter we freeze (Debian's 3.11.2)
predates tarfile's extraction filters.
"""

from __future__ import annotations

import asyncio
import io
import os
import queue
import stat
import tarfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from sandman.daemon.errors import BadRequest, NotFound
from sandman.daemon.paths import PathPolicy

CHUNK = 256 << 10
QUEUE_DEPTH = 16  # chunks in flight between loop and thread: 4 MiB of memory


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
    policy: PathPolicy, root: Path, tar: tarfile.TarFile, m: tarfile.TarInfo, stats: ExtractStats
) -> None:
    target = _member_target(policy, root, m.name)
    mode = stat.S_IMODE(m.mode) & ~(stat.S_ISUID | stat.S_ISGID)
    if m.isdir():
        target.mkdir(parents=True, exist_ok=True)
        os.chmod(target, mode | stat.S_IRWXU)
        stats.dirs += 1
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(target) and not os.path.isdir(target):
        os.unlink(target)
    if m.isfile():
        src = tar.extractfile(m)
        assert src is not None
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as out:
            while chunk := src.read(CHUNK):
                out.write(chunk)
                stats.bytes += len(chunk)
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
        os.link(source, target)
        stats.links += 1
    else:
        raise BadRequest(
            f"tar member {m.name!r} is a device or fifo; only files, dirs and links",
            code="bad_tar",
        )


def extract_worker(policy: PathPolicy, root: Path, reader: _QueueReader) -> ExtractStats:
    stats = ExtractStats()
    try:
        with tarfile.open(fileobj=reader, mode="r|*") as tar:  # type: ignore[call-overload]
            for m in tar:
                _extract_one(policy, root, tar, m, stats)
    except tarfile.TarError as e:
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
    work = loop.run_in_executor(None, extract_worker, policy, root, reader)
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


def _add_tree(tar: tarfile.TarFile, policy: PathPolicy, path: Path, arcname: str) -> None:
    for prot in policy.protected:
        if os.path.realpath(prot) == str(path):
            return  # never archive the daemon's own dir
    tar.add(path, arcname=arcname, recursive=False)
    if path.is_dir() and not path.is_symlink():
        for name in sorted(os.listdir(path)):
            _add_tree(tar, policy, path / name, f"{arcname}/{name}")


class _QueueWriter(io.RawIOBase):
    def __init__(self, loop: asyncio.AbstractEventLoop, q: asyncio.Queue[bytes | None]) -> None:
        self.loop, self.q = loop, q
        self.cancelled = threading.Event()

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        if self.cancelled.is_set():
            raise BrokenPipeError("client went away")
        asyncio.run_coroutine_threadsafe(self.q.put(bytes(b)), self.loop).result()
        return len(b)


async def archive(policy: PathPolicy, raw: object, gzip: bool) -> AsyncIterator[bytes]:
    """Yield a tar (optionally gzip) of a file or directory tree."""
    path = policy.target(raw)
    if not os.path.lexists(path):
        raise NotFound(f"{path}: no such file or directory")
    loop = asyncio.get_running_loop()
    q: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=QUEUE_DEPTH)
    writer = _QueueWriter(loop, q)

    def work() -> None:
        try:
            buffered = io.BufferedWriter(writer, buffer_size=CHUNK)
            with tarfile.open(fileobj=buffered, mode="w|gz" if gzip else "w|") as tar:  # type: ignore[call-overload]
                _add_tree(tar, policy, path, path.name or "root")
            buffered.flush()
        finally:
            asyncio.run_coroutine_threadsafe(q.put(None), loop).result()

    fut = loop.run_in_executor(None, work)
    try:
        while (chunk := await q.get()) is not None:
            yield chunk
    finally:
        writer.cancelled.set()
        while not fut.done():  # unblock a worker waiting on a full queue
            try:
                q.get_nowait()
            except asyncio.QueueEmpty:
                await asyncio.sleep(0.01)
        exc = fut.exception()
        if exc is not None and not isinstance(exc, BrokenPipeError):
            raise exc
