"""The file API: streamed read/write, metadata ops, tar, and the path policy."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from tests.unit.daemon.helpers import Daemon

pytestmark = pytest.mark.daemon_process


def test_write_read_stat_list_move_remove(daemon: Daemon, tmp_path: Path) -> None:
    f = tmp_path / "a" / "b.bin"
    blob = bytes(range(256)) * 5000
    status, doc = daemon.request("PUT", f"/v1/files?path={f}&mkdirs=1&mode=0600", raw=blob)
    assert status == 201 and doc["bytes"] == len(blob)
    assert daemon.request("GET", f"/v1/files?path={f}") == (200, blob)
    st = daemon.ok("GET", f"/v1/files/stat?path={f}")
    assert (st["type"], st["size"], st["mode"]) == ("file", len(blob), "0600")
    daemon.request("PUT", f"/v1/files?path={f}&append=1", raw=b"tail")
    assert daemon.request("GET", f"/v1/files?path={f}")[1].endswith(b"tail")
    listing = daemon.ok("GET", f"/v1/files/list?path={tmp_path / 'a'}")
    assert [e["name"] for e in listing["entries"]] == ["b.bin"]
    daemon.ok("POST", "/v1/files/mkdir", {"path": str(tmp_path / "x" / "y")})
    moved = daemon.ok("POST", "/v1/files/move", {"src": str(f), "dst": str(tmp_path / "x/c")})
    assert moved["path"] == str(tmp_path / "x" / "c")
    status, doc = daemon.request(
        "POST", "/v1/files/move", {"src": str(tmp_path / "x/c"), "dst": str(tmp_path / "x/y")}
    )
    assert status == 409 and doc["error"]["code"] == "exists"
    status, doc = daemon.request("POST", "/v1/files/remove", {"path": str(tmp_path / "x")})
    assert status == 409 and doc["error"]["code"] == "not_empty"
    daemon.ok("POST", "/v1/files/remove", {"path": str(tmp_path / "x"), "recursive": True})
    assert not (tmp_path / "x").exists()


def test_missing_and_wrong_kinds(daemon: Daemon, tmp_path: Path) -> None:
    assert daemon.request("GET", f"/v1/files?path={tmp_path}/nope")[1]["error"]["code"] == (
        "not_found"
    )
    status, doc = daemon.request("GET", f"/v1/files?path={tmp_path}")
    assert status == 400 and doc["error"]["code"] == "not_a_file"
    status, doc = daemon.request("GET", "/v1/files?path=relative/path")
    assert status == 400
    status, doc = daemon.request("GET", "/v1/files")
    assert status == 400


def test_daemon_dir_is_protected_even_through_symlinks_and_dotdot(
    daemon: Daemon, tmp_path: Path
) -> None:
    own = tmp_path / "d"  # the daemon dir of this fixture
    link = tmp_path / "sneaky"
    os.symlink(own, link)
    for path in (
        f"{own}/pristine.json",
        f"{link}/pristine.json",
        f"{tmp_path}/other/../d/pristine.json",
    ):
        status, doc = daemon.request("GET", f"/v1/files?path={path}")
        assert status == 403 and doc["error"]["code"] == "path_protected", path
    status, _ = daemon.request("PUT", f"/v1/files?path={link}/evil", raw=b"x")
    assert status == 403
    (own / "run").mkdir(exist_ok=True)  # the daemon's scratch dir (sessions)
    status, _ = daemon.request(
        "POST", "/v1/files/remove", {"path": str(tmp_path), "recursive": True}
    )
    assert status == 403  # would take the daemon's dir with it
    assert (own / "run").is_dir()


def test_tar_upload_and_download(daemon: Daemon, tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("pkg/mod.py", b"x = 1\n"), ("pkg/data/big.bin", os.urandom(300_000))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("pkg/link")
        link.type = tarfile.SYMTYPE
        link.linkname = "mod.py"
        tar.addfile(link)
    dest = tmp_path / "up"
    status, doc = daemon.request("PUT", f"/v1/files/tar?path={dest}&mkdirs=1", raw=buf.getvalue())
    assert status == 201 and (doc["files"], doc["links"]) == (2, 1)
    assert (dest / "pkg" / "mod.py").read_bytes() == b"x = 1\n"
    assert os.readlink(dest / "pkg" / "link") == "mod.py"

    status, body = daemon.request("GET", f"/v1/files/tar?path={dest / 'pkg'}&gzip=1")
    assert status == 200
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        names = sorted(tar.getnames())
    assert names == ["pkg", "pkg/data", "pkg/data/big.bin", "pkg/link", "pkg/mod.py"]


def test_tar_upload_rejects_escapes(daemon: Daemon, tmp_path: Path) -> None:
    dest = tmp_path / "t"
    dest.mkdir()
    for name, kind, target in (
        ("../evil", tarfile.REGTYPE, ""),
        ("/abs/evil", tarfile.REGTYPE, ""),
        ("lnk", tarfile.SYMTYPE, str(tmp_path / "d" / "pristine.json")),
        ("dev", tarfile.CHRTYPE, ""),
    ):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = target
            tar.addfile(info, io.BytesIO(b""))
        status, doc = daemon.request("PUT", f"/v1/files/tar?path={dest}", raw=buf.getvalue())
        assert status in (400, 403), (name, status, doc)
    assert not (tmp_path / "evil").exists()
    status, doc = daemon.request("PUT", f"/v1/files/tar?path={dest}", raw=b"not a tar at all")
    assert status == 400 and doc["error"]["code"] == "bad_tar"
    assert daemon.exec(["true"])["exit_code"] == 0
