"""Write a tar (optionally gzip) of a file or tree, reading the tree race-free.

Synchronous: ``tarstream.archive`` runs it in a worker thread. The tree is
walked relative to open directory descriptors and no symlink is ever followed
(``O_NOFOLLOW``), so an entry swapped for a symlink while the archive is made
cannot lead the walk elsewhere (into the daemon's own directory, say), and the
daemon's directories are recognised by identity (device, inode), not by name.
Content is opened non-blocking and only regular files are read: a file
swapped for a FIFO cannot hang the worker.

A tree that changes under the walk cannot be archived honestly: a file that
vanished after its directory was listed, or that shrank while it was read,
would leave a hole or a member shorter than its header promised. Those raise
``SourceChanged`` and the stream is aborted (``tarstream``); growth is not an
error (a member holds the size seen when the file was opened). Members are
written by this module (headers by ``tarfile.TarInfo``, compression by zlib),
so a failed archive never gets an end-of-archive marker or a gzip trailer.
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
import zlib
from collections.abc import Callable

CHUNK = 256 << 10  # emitted pieces, and reads of file content
BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE  # tar(1) pads archives to 20 blocks, as tarfile does
# zlib level 6 (gzip(1)'s default): level 9, tarfile's default, costs about
# twice the CPU for ~1% smaller source trees.
GZIP_LEVEL = 6
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ArchiveError(Exception):
    """Why an archive could not be made; ``code`` and ``status`` as the API's."""

    status = 409
    code = "source_changed"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status


class SourceChanged(ArchiveError):
    """An entry vanished, shrank or changed type while the archive was made."""


def _os_error(e: OSError, shown: str) -> ArchiveError:
    if e.errno == errno.ENOENT:
        return SourceChanged(f"{shown} vanished while the archive was made; retry")
    if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EINVAL):
        return SourceChanged(f"{shown} changed type while the archive was made; retry")
    if e.errno in (errno.EACCES, errno.EPERM):
        return ArchiveError(f"{shown}: permission denied", code="forbidden", status=403)
    return ArchiveError(f"{shown}: {e.strerror}", code="archive_failed", status=400)


class Archiver:
    """One archive; ``emit`` gets the output in pieces of about ``CHUNK`` bytes.

    Not thread-safe: one worker thread drives it from start to ``finish``.
    """

    def __init__(
        self, emit: Callable[[bytes], None], *, gzip: bool, skip: frozenset[tuple[int, int]]
    ) -> None:
        self._emit = emit
        self._skip = skip  # (st_dev, st_ino) of directories never archived
        self._z = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31) if gzip else None
        self._buf = bytearray()
        self._written = 0  # uncompressed tar bytes, for the final padding
        self._links: dict[tuple[int, int], str] = {}  # hard links: first member's name

    # -- output ---------------------------------------------------------------
    def _out(self, data: bytes) -> None:
        self._written += len(data)
        self._buf += self._z.compress(data) if self._z is not None else data
        if len(self._buf) >= CHUNK:
            self._emit(bytes(self._buf))
            self._buf.clear()

    def _header(self, ti: tarfile.TarInfo) -> None:
        self._out(ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))

    def finish(self) -> None:
        """The end-of-archive marker, padding and (gzip) trailer; then the rest."""
        self._out(b"\0" * (2 * BLOCK))
        rest = self._written % RECORD
        if rest:
            self._out(b"\0" * (RECORD - rest))
        if self._z is not None:
            self._buf += self._z.flush()
        if self._buf:
            self._emit(bytes(self._buf))
            self._buf.clear()

    # -- walking --------------------------------------------------------------
    def add(self, path: str, arcname: str) -> None:
        """Archive ``path`` (already resolved and allowed by the path policy)."""
        parent, name = os.path.split(path.rstrip("/")) if path != "/" else ("/", ".")
        try:
            dfd = os.open(parent or "/", _DIR_FLAGS & ~os.O_NOFOLLOW)
        except OSError as e:
            raise _os_error(e, parent) from None
        try:
            self._entry(dfd, name, arcname, path)
        finally:
            os.close(dfd)

    def _entry(self, dfd: int, name: str, arc: str, shown: str) -> None:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError as e:
            raise _os_error(e, shown) from None
        kind = stat.S_IFMT(st.st_mode)
        if kind == stat.S_IFDIR:
            self._dir(dfd, name, arc, shown, st)
        elif kind == stat.S_IFREG:
            self._file(dfd, name, arc, shown, st)
        elif kind == stat.S_IFLNK:
            try:
                target = os.readlink(name, dir_fd=dfd)
            except OSError as e:
                raise _os_error(e, shown) from None
            self._header(_info(arc, tarfile.SYMTYPE, st, linkname=target))
        elif kind in (stat.S_IFIFO, stat.S_IFCHR, stat.S_IFBLK):
            ti = _info(arc, _DEVICE_TYPES[kind], st)
            if kind != stat.S_IFIFO:
                ti.devmajor, ti.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
            self._header(ti)
        # Sockets have no tar representation; tar(1) skips them too.

    def _dir(self, dfd: int, name: str, arc: str, shown: str, st: os.stat_result) -> None:
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
        except OSError as e:
            raise _os_error(e, shown) from None
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise SourceChanged(f"{shown} was replaced while the archive was made; retry")
            if (now.st_dev, now.st_ino) in self._skip:
                return  # the daemon's own directory is never archived
            self._header(_info(arc, tarfile.DIRTYPE, now))
            try:
                names = sorted(os.listdir(fd))
            except OSError as e:
                raise _os_error(e, shown) from None
            for child in names:
                self._entry(fd, child, f"{arc}/{child}", f"{shown.rstrip('/')}/{child}")
        finally:
            os.close(fd)

    def _file(self, dfd: int, name: str, arc: str, shown: str, st: os.stat_result) -> None:
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
        except OSError as e:
            raise _os_error(e, shown) from None
        try:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (
                st.st_dev,
                st.st_ino,
            ):
                raise SourceChanged(f"{shown} was replaced while the archive was made; retry")
            key = (now.st_dev, now.st_ino)
            if now.st_nlink > 1:
                first = self._links.get(key)
                if first is not None:
                    self._header(_info(arc, tarfile.LNKTYPE, now, linkname=first))
                    return
                self._links[key] = arc
            size = now.st_size
            self._header(_info(arc, tarfile.REGTYPE, now, size=size))
            left = size
            while left:
                try:
                    data = os.read(fd, min(left, CHUNK))
                except OSError as e:
                    raise _os_error(e, shown) from None
                if not data:
                    raise SourceChanged(
                        f"{shown} shrank while the archive was made "
                        f"({size - left} of {size} bytes read); retry"
                    )
                left -= len(data)
                self._out(data)
            if size % BLOCK:
                self._out(b"\0" * (BLOCK - size % BLOCK))
        finally:
            os.close(fd)


_DEVICE_TYPES = {
    stat.S_IFIFO: tarfile.FIFOTYPE,
    stat.S_IFCHR: tarfile.CHRTYPE,
    stat.S_IFBLK: tarfile.BLKTYPE,
}


def _info(
    arc: str, kind: bytes, st: os.stat_result, *, size: int = 0, linkname: str = ""
) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(arc)
    ti.type = kind
    ti.mode = stat.S_IMODE(st.st_mode)
    ti.uid, ti.gid = st.st_uid, st.st_gid
    ti.mtime = st.st_mtime_ns // 1_000_000_000  # whole seconds: no pax record per member
    ti.size = size
    ti.linkname = linkname
    return ti
