"""Tar download and upload under hostile conditions: a tree that changes while
it is archived, swapped entries, hostile archives.

A download that fails after its 200 went out must never look like a whole
archive: the daemon ends it with an error record and cuts the connection
before the terminating chunk, so every HTTP client raises, and the SDK
reports the daemon's reason (before: the SDK surfaced aiohttp's payload
error, not a Sandman error saying what happened).
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import io
import os
import socket
import ssl
import stat
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest

from sandman.client import SandmanClient, StreamAborted
from sandman.client.sandbox import Sandbox
from sandman.client.transport import HttpTransport
from sandman.daemon import tarstream, tarwrite
from sandman.daemon.errors import APIError
from sandman.daemon.paths import PathPolicy
from sandman.kube_async import Credentials, KubeClient
from tests.unit.daemon.helpers import TOKEN, Daemon

pytestmark = pytest.mark.daemon_process

BIG = 64 << 20  # larger than every buffer between the archiver and the client


def _tar_names(body: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
        return {m.name: m for m in tar.getmembers()}


def test_download_keeps_every_kind_and_never_the_daemon_dir(daemon: Daemon) -> None:
    root = daemon.root
    data = root / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "x").write_text("x")
    os.link(data / "sub" / "x", data / "hard")
    os.symlink(root / "d", data / "to-daemon")  # kept as a link, never followed
    os.mkfifo(data / "fifo")  # a header only: nothing is read from it
    odd = os.fsdecode(b"\xffname")  # not UTF-8
    (data / odd).write_bytes(b"odd")
    for gz in ("0", "1"):
        status, body = daemon.request("GET", f"/v1/files/tar?path={data}&gzip={gz}")
        assert status == 200
        m = _tar_names(body)
        assert set(m) == {
            "data",
            "data/sub",
            "data/sub/x",
            "data/hard",
            "data/to-daemon",
            "data/fifo",
            f"data/{odd}",
        }
        assert m["data/to-daemon"].issym() and m["data/to-daemon"].linkname == str(root / "d")
        assert m["data/fifo"].isfifo()
        assert m["data/sub/x"].islnk() and m["data/sub/x"].linkname == "data/hard"
    # Archiving a parent of the daemon's dir leaves the daemon's dir out.
    (root / "d" / "secret").write_text("daemon state")
    status, body = daemon.request("GET", f"/v1/files/tar?path={root}")
    assert status == 200
    names = set(_tar_names(body))
    assert f"{root.name}/data/sub/x" in names
    assert not any(n == f"{root.name}/d" or n.startswith(f"{root.name}/d/") for n in names)


def _start_download(daemon: Daemon, path: Path) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", daemon.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    s.sendall(
        f"GET /v1/files/tar?path={path} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    assert s.recv(4096).startswith(b"HTTP/1.1 200")  # the archive is under way
    return s


def _read_rest(s: socket.socket) -> bytes:
    buf = bytearray()
    while chunk := s.recv(1 << 20):
        buf += chunk
    s.close()
    return bytes(buf)


def _tree(daemon: Daemon) -> Path:
    data = daemon.root / "tree"
    data.mkdir()
    (data / "a.bin").write_bytes(os.urandom(BIG))  # archived first (sorted)
    (data / "b.txt").write_text("b" * 1000)  # listed already when a.bin streams
    return data


def test_a_file_that_vanishes_mid_stream_cuts_the_stream_with_the_reason(daemon: Daemon) -> None:
    data = _tree(daemon)
    # The archiver is stuck in a.bin (the client reads nothing), b.txt is listed.
    s = _start_download(daemon, data)
    (data / "b.txt").unlink()
    body = _read_rest(s)
    # No terminating chunk: the stream ends with the error record, then EOF.
    assert not body.endswith(b"0\r\n\r\n")
    assert b'"code": "source_changed"' in body[-400:] and b"b.txt vanished" in body[-400:]
    assert daemon.request("GET", "/healthz") == (200, {"ok": True})

    # A stock HTTP client raises instead of returning a short archive.
    (data / "b.txt").write_text("b")
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    conn.request("GET", f"/v1/files/tar?path={data}", headers={"Authorization": f"Bearer {TOKEN}"})
    resp = conn.getresponse()
    first = resp.read(1 << 16)
    assert first
    (data / "b.txt").unlink()
    with pytest.raises(http.client.IncompleteRead):
        resp.read()
    conn.close()


def test_a_file_that_shrinks_mid_stream_cuts_the_stream(daemon: Daemon) -> None:
    data = _tree(daemon)
    s = _start_download(daemon, data)
    os.truncate(data / "a.bin", 1 << 20)  # the archiver is inside a.bin
    body = _read_rest(s)
    assert b"a.bin shrank" in body[-400:] and not body.endswith(b"0\r\n\r\n")


class _PausingTransport(HttpTransport):
    """The real transport, but the reader stops after the first chunk until
    ``between`` ran: the SDK would otherwise drain the stream before the test
    can change the tree under it."""

    def __init__(self, *args: Any, between: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.between = between

    async def send(self, target: Any, req: Any, timeout: float) -> Any:
        resp = await super().send(target, req, timeout)
        between = self.between

        class Paused:
            status = resp.status

            async def read(self) -> bytes:
                return await resp.read()

            async def chunks(self) -> Any:
                first = True
                async for chunk in resp.chunks():
                    yield chunk
                    if first:
                        first = False
                        between()

            async def close(self) -> None:
                await resp.close()

        return Paused()


def test_the_sdk_raises_the_daemons_reason(daemon: Daemon) -> None:
    data = _tree(daemon)
    kube = KubeClient(Credentials("https://127.0.0.1:1", ssl.create_default_context()))
    meta = {"name": "sb", "namespace": "ns", "uid": "u", "labels": {"sandman.dev/id": "i"}}
    pod = {"metadata": meta, "status": {"podIP": "127.0.0.1"}}

    async def download(path: Path, between: Any) -> bytes:
        transport = _PausingTransport(kube, "direct", port=daemon.port, between=between)
        async with SandmanClient(kube=kube, namespace="ns", transport=transport) as c:
            sb = Sandbox(c, pod)
            sb._token = TOKEN  # the fixture daemon's token, not one derived from a key
            return await sb.download_tar(str(path))

    whole = asyncio.run(download(data, lambda: None))
    assert set(_tar_names(whole)) == {"tree", "tree/a.bin", "tree/b.txt"}
    with pytest.raises(StreamAborted) as e:
        asyncio.run(download(data, (data / "b.txt").unlink))
    assert (e.value.status, e.value.code) == (200, "source_changed")
    assert "b.txt vanished" in e.value.message


def test_errors_before_the_first_chunk_are_plain_json(daemon: Daemon) -> None:
    status, doc = daemon.request("GET", f"/v1/files/tar?path={daemon.root}/nope")
    assert status == 404 and doc["error"]["code"] == "not_found"
    status, doc = daemon.request("GET", f"/v1/files/tar?path={daemon.root}/d")
    assert status == 403 and doc["error"]["code"] == "path_protected"


def test_an_entry_swapped_for_a_fifo_after_listing_is_refused_at_once(tmp_path: Path) -> None:
    """The window between listing (stat) and opening: the old archiver opened
    with a blocking open(), which waits forever for a FIFO's writer."""
    (tmp_path / "f").write_text("content")
    st = os.stat(tmp_path / "f", follow_symlinks=False)
    os.unlink(tmp_path / "f")
    os.mkfifo(tmp_path / "f")
    arc = tarwrite.Archiver(lambda b: None, gzip=False, skip=frozenset())
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(tarwrite.SourceChanged, match="replaced"):
            arc._file(dfd, "f", "f", str(tmp_path / "f"), st)
        # ... and a directory swapped for a symlink is not followed.
        (tmp_path / "dir").mkdir()
        st = os.stat(tmp_path / "dir", follow_symlinks=False)
        os.rmdir(tmp_path / "dir")
        os.symlink("/", tmp_path / "dir")
        with pytest.raises(tarwrite.SourceChanged, match="changed type"):
            arc._dir(dfd, "dir", "dir", str(tmp_path / "dir"), st)
    finally:
        os.close(dfd)


# -- upload -------------------------------------------------------------------------
def _raw_member(name: str, kind: bytes, size: int) -> bytes:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.size = size
    return ti.tobuf(tarfile.USTAR_FORMAT)


def _extract(tmp_path: Path, data: bytes, limit: int = 1 << 30) -> Any:
    policy = PathPolicy((tmp_path,), (tmp_path / "d",))
    reader = tarstream._QueueReader()
    t = threading.Thread(target=lambda: [reader.q.put(data), reader.q.put(None)])
    t.start()
    try:
        return tarstream.extract_worker(policy, tmp_path, reader, limit)
    finally:
        t.join()


def test_upload_refuses_giant_headers_sparse_members_and_bombs(tmp_path: Path) -> None:
    # A pax header claiming 4 GiB: tarfile would read it into memory whole.
    with pytest.raises(APIError, match="header block"):
        _extract(tmp_path, _raw_member("x", tarfile.XHDTYPE, 4 << 30))
    with pytest.raises(APIError, match="header block"):
        _extract(tmp_path, _raw_member("x", tarfile.GNUTYPE_LONGNAME, 4 << 30))
    with pytest.raises(APIError, match="sparse"):
        _extract(tmp_path, _raw_member("x", tarfile.GNUTYPE_SPARSE, 10) + b"\0" * 1024)
    # Unpacked bytes are capped (a gzip of zeros unpacks a thousandfold).
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        ti = tarfile.TarInfo("zeros")
        ti.size = 4 << 20
        tar.addfile(ti, io.BytesIO(bytes(ti.size)))
    with pytest.raises(APIError, match="unpacks to more than") as e:
        _extract(tmp_path, buf.getvalue(), limit=1 << 20)
    assert e.value.status == 413


def test_upload_conflicts_are_4xx_and_never_write_through_links(
    daemon: Daemon, tmp_path: Path
) -> None:
    dest = tmp_path / "up"
    dest.mkdir()
    (dest / "adir").mkdir()
    os.symlink(daemon.root / "d", dest / "to-daemon")
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    os.symlink(outside, dest / "link")

    def tar_of(*members: tuple[str, bytes, bytes]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, kind, payload in members:
                ti = tarfile.TarInfo(name)
                ti.type = kind
                ti.size = len(payload) if kind == tarfile.REGTYPE else 0
                if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                    ti.linkname = payload.decode()
                tar.addfile(ti, io.BytesIO(payload) if kind == tarfile.REGTYPE else None)
        return buf.getvalue()

    cases = [
        (tar_of(("to-daemon/evil", tarfile.REGTYPE, b"x")), 403),  # through a link into /.sandman
        (tar_of(("adir", tarfile.SYMTYPE, b"/")), 409),  # a link over a directory
        (tar_of(("adir", tarfile.REGTYPE, b"x")), 409),  # a file over a directory
        (tar_of(("h", tarfile.LNKTYPE, b"nowhere")), 404),  # a hard link to nothing
    ]
    for body, want in cases:
        status, doc = daemon.request("PUT", f"/v1/files/tar?path={dest}", raw=body)
        assert status == want, (status, doc)
    # A file member over a symlink replaces the link; the link's target is untouched.
    status, _ = daemon.request(
        "PUT", f"/v1/files/tar?path={dest}", raw=tar_of(("link", tarfile.REGTYPE, b"new"))
    )
    assert status == 201
    assert outside.read_text() == "keep" and (dest / "link").read_text() == "new"
    assert not stat.S_ISLNK(os.lstat(dest / "link").st_mode)
    assert not (daemon.root / "d" / "evil").exists()
    assert daemon.request("GET", "/healthz")[0] == 200


def test_extracted_tree_round_trips_by_content(daemon: Daemon, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    blobs = {f"a/b/{i}.bin": os.urandom(i * 1000 + 1) for i in range(20)}
    for rel, blob in blobs.items():
        (src / rel).write_bytes(blob)
    status, body = daemon.request("GET", f"/v1/files/tar?path={src}&gzip=1")
    assert status == 200
    dest = tmp_path / "dest"
    status, doc = daemon.request("PUT", f"/v1/files/tar?path={dest}&mkdirs=1", raw=body)
    assert status == 201 and doc["files"] == len(blobs)
    for rel, blob in blobs.items():
        got = (dest / "src" / rel).read_bytes()
        assert hashlib.sha256(got).digest() == hashlib.sha256(blob).digest()
