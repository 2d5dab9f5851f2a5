"""File operations behind the file API (synchronous; the API runs them in its
thread pool, never on the event loop).

Content transfer (streamed reads/writes, tar) lives in the API handlers and
``tarstream``; this module does metadata operations and their error mapping.
Opens are non-blocking and refuse anything but regular files for content:
opening a FIFO blocks until its other end shows up, which on the event loop
froze the whole daemon (and /healthz with it).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sandman.daemon.errors import APIError, BadRequest, Conflict, Forbidden, NotFound
from sandman.daemon.paths import PathPolicy

MAX_LIST_ENTRIES = 10_000  # a listing beyond this is cut and says so

_KINDS = {
    stat.S_IFREG: "file",
    stat.S_IFDIR: "dir",
    stat.S_IFLNK: "symlink",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "char_device",
    stat.S_IFBLK: "block_device",
}


@contextmanager
def os_errors(path: Path | str) -> Iterator[None]:
    """Turn the OSErrors a client can cause into API errors."""
    try:
        yield
    except APIError:
        raise
    except FileNotFoundError:
        raise NotFound(f"{path}: no such file or directory") from None
    except FileExistsError:
        raise Conflict(f"{path}: already exists", code="exists") from None
    except IsADirectoryError:
        raise BadRequest(f"{path}: is a directory", code="is_dir") from None
    except NotADirectoryError:
        raise BadRequest(f"{path}: not a directory", code="not_dir") from None
    except PermissionError:
        raise Forbidden(f"{path}: permission denied") from None
    except OSError as e:
        if e.errno == errno.ENOTEMPTY:
            raise Conflict(f"{path}: directory not empty", code="not_empty") from None
        if e.errno == errno.ENOSPC:
            raise APIError(f"{path}: no space left on device", code="no_space") from None
        raise BadRequest(f"{path}: {e.strerror}") from None


def describe(path: Path, st: os.stat_result, name: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": name if name is not None else path.name,
        "path": str(path),
        "type": _KINDS.get(stat.S_IFMT(st.st_mode), "other"),
        "size": st.st_size,
        "mode": f"{stat.S_IMODE(st.st_mode):04o}",
        "mtime": st.st_mtime,
        "uid": st.st_uid,
        "gid": st.st_gid,
    }
    if stat.S_ISLNK(st.st_mode):
        doc["link_target"] = os.readlink(path)
    return doc


def stat_path(policy: PathPolicy, raw: object, follow: bool = False) -> dict[str, Any]:
    path = policy.target(raw) if follow else policy.entry(raw)
    with os_errors(path):
        return describe(path, os.stat(path) if follow else os.lstat(path))


def list_dir(policy: PathPolicy, raw: object) -> dict[str, Any]:
    path = policy.target(raw)
    entries = []
    truncated = False
    with os_errors(path), os.scandir(path) as it:
        for i, entry in enumerate(it):
            if i >= MAX_LIST_ENTRIES:
                truncated = True
                break
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we listed
            entries.append(describe(Path(entry.path), st, entry.name))
    entries.sort(key=lambda e: e["name"])
    return {"path": str(path), "entries": entries, "truncated": truncated}


def parse_mode(value: object, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        mode = value
    elif isinstance(value, str):
        try:
            mode = int(value, 8)
        except ValueError:
            raise BadRequest(f"mode must be octal like '0644', got {value!r}") from None
    else:
        raise BadRequest("mode must be an octal string like '0644'")
    if not 0 <= mode <= 0o7777:
        raise BadRequest("mode out of range")
    return mode


def make_dir(policy: PathPolicy, raw: object, parents: bool, mode: int) -> dict[str, Any]:
    path = policy.target(raw)
    with os_errors(path):
        if parents:
            path.mkdir(mode=mode, parents=True, exist_ok=True)
        else:
            path.mkdir(mode=mode)
        return describe(path, os.lstat(path))


def _guard_protected(policy: PathPolicy, path: Path) -> None:
    # Removing or moving a directory that contains the daemon's own dir would
    # take the daemon with it.
    for prot in policy.protected:
        real = os.path.realpath(prot)
        if real == str(path) or real.startswith(str(path).rstrip("/") + "/"):
            raise Forbidden(f"{path} contains the daemon's own {real}", code="path_protected")


def remove(policy: PathPolicy, raw: object, recursive: bool) -> dict[str, Any]:
    path = policy.entry(raw)
    _guard_protected(policy, path)
    with os_errors(path):
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            if recursive:
                shutil.rmtree(path)
            else:
                path.rmdir()
        else:
            path.unlink()
    return {"removed": str(path)}


def move(policy: PathPolicy, src_raw: object, dst_raw: object, overwrite: bool) -> dict[str, Any]:
    src = policy.entry(src_raw)
    dst = policy.entry(dst_raw)
    _guard_protected(policy, src)
    with os_errors(src):
        os.lstat(src)
    with os_errors(dst):
        if os.path.lexists(dst) and not overwrite:
            raise Conflict(f"{dst} exists; pass overwrite: true to replace it", code="exists")
        os.replace(src, dst)
        return describe(dst, os.lstat(dst))


def open_for_write(
    policy: PathPolicy, raw: object, *, mode: int, mkdirs: bool, append: bool
) -> tuple[Path, Path | None, int]:
    """Open the destination of an upload: (final path, temp path or None, fd).

    Plain writes go to a temp file renamed over the target at the end, so a
    reader never sees half a file and a failed upload leaves the old one.
    """
    path = policy.target(raw)
    with os_errors(path):
        if mkdirs:
            path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            raise BadRequest(f"{path}: is a directory", code="is_dir")
        if os.path.exists(path) and not path.is_file():
            # A device, FIFO or socket is not replaced by a file (PUT over
            # /dev/null would otherwise break every command in the sandbox).
            raise BadRequest(f"{path} is not a regular file", code="not_a_file")
        if append:
            # O_NONBLOCK: a FIFO without a reader fails (ENXIO) instead of
            # waiting for one; then anything but a regular file is refused.
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, mode)
            except OSError as e:
                if e.errno == errno.ENXIO:
                    raise BadRequest(f"{path} is not a regular file", code="not_a_file") from None
                raise
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise BadRequest(f"{path} is not a regular file", code="not_a_file")
            os.set_blocking(fd, True)
            return path, None, fd
        tmp = path.with_name(f".{path.name}.sandman-upload-{os.getpid()}-{id(path)}")
        return path, tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_EXCL, mode)


def finish_write(path: Path, tmp: Path | None, fd: int, ok: bool) -> None:
    os.close(fd)
    if tmp is None:
        return
    if ok:
        with os_errors(path):
            os.replace(tmp, path)
    else:
        tmp.unlink(missing_ok=True)


def open_for_read(policy: PathPolicy, raw: object) -> tuple[Path, int, int]:
    """(path, fd, size) of a regular file to stream out."""
    path = policy.target(raw)
    with os_errors(path):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            kind = "a directory; use /v1/files/list" if stat.S_ISDIR(st.st_mode) else "not a file"
            raise BadRequest(f"{path} is {kind}", code="not_a_file")
        os.set_blocking(fd, True)
        return path, fd, st.st_size


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
