"""`cp POD:PATH LOCAL` unpacks safely on every Python 3.11 we support.

The same cases run under this interpreter (3.11.4+: tarfile's data filter)
and under Debian's /usr/bin/python3.11 (3.11.2: no filters at all, so
sandman.cli.copying applies the rules itself): an archive from a sandbox may
not write outside the target, plant links out of it, create devices or keep
setuid bits, and a refused archive writes nothing.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DEBIAN_PYTHON = Path("/usr/bin/python3.11")
PYTHONS = [sys.executable, str(DEBIAN_PYTHON)]


def member(name: str, data: bytes = b"x", **kw: object) -> tuple[tarfile.TarInfo, bytes]:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mode = 0o644
    for k, v in kw.items():
        setattr(ti, k, v)
    if ti.type != tarfile.REGTYPE:
        ti.size = 0
    return ti, data


def archive(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for ti, data in members:
            tar.addfile(ti, io.BytesIO(data) if ti.isreg() else None)
    return buf.getvalue()


GOOD = archive(
    member("tree", type=tarfile.DIRTYPE, mode=0o755),
    member("tree/a.txt", b"alpha"),
    member("tree/sub", type=tarfile.DIRTYPE, mode=0o755),
    member("tree/sub/b.txt", b"beta", mode=0o4775),  # setuid and group-write: dropped
    member("/tree/sub/c.txt", b"gamma"),  # a leading slash is stripped, as tar does
    member("tree/link", type=tarfile.SYMTYPE, linkname="sub/b.txt"),
    member("tree/hard", type=tarfile.LNKTYPE, linkname="tree/a.txt"),
)
HOSTILE = {
    "climbing name": member("tree/../../evil"),
    "absolute symlink": member("tree/passwd", type=tarfile.SYMTYPE, linkname="/etc/passwd"),
    "symlink out": member("tree/up", type=tarfile.SYMTYPE, linkname="../../outside"),
    "hard link out": member("tree/h", type=tarfile.LNKTYPE, linkname="../outside"),
    "device": member("tree/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3),
    "fifo": member("tree/fifo", type=tarfile.FIFOTYPE),
}

# Runs in a child interpreter: extract an archive, report what happened.
SCRIPT = """
import io, json, os, sys, tarfile
from pathlib import Path
from sandman.cli import copying
data, dest, rename = sys.stdin.buffer.read(), Path(sys.argv[1]), sys.argv[2]
with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    members = tar.getmembers()
    try:
        if rename:
            copying.rename_top(members, members[0].name.split("/")[0], rename)
        copying.extract(tar, dest, members)
        res = {"ok": True}
    except copying.UnsafeArchive as e:
        res = {"ok": False, "error": str(e)}
res["filters"] = copying.HAS_FILTERS
res["files"] = sorted(
    str(p.relative_to(dest.parent)) for p in dest.parent.rglob("*") if p != dest
)
print(json.dumps(res))
"""


def extract(python: str, data: bytes, dest: Path, rename: str = "") -> dict[str, object]:
    out = subprocess.run(
        [python, "-I", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n{SCRIPT}",
         str(dest), rename],
        input=data, capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.fixture(params=PYTHONS, ids=["venv-python", "debian-3.11.2"])
def python(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_the_oldest_python_really_lacks_filters() -> None:
    """Else the fallback below would not be what runs there."""
    out = subprocess.run(
        [str(DEBIAN_PYTHON), "-c", "import sys, tarfile; print(sys.version_info[:3], "
         "hasattr(tarfile, 'data_filter'))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "(3, 11, 2) False", out.stdout


def test_a_tree_unpacks_with_links_inside_and_unsafe_bits_dropped(
    python: str, tmp_path: Path
) -> None:
    dest = tmp_path / "out" / "into"
    res = extract(python, GOOD, dest)
    assert res["ok"], res
    tree = dest / "tree"
    assert (tree / "a.txt").read_bytes() == b"alpha"
    assert (tree / "link").read_bytes() == b"beta" and (tree / "link").is_symlink()
    assert (tree / "hard").read_bytes() == b"alpha"
    assert (tree / "sub" / "b.txt").stat().st_mode & 0o7777 == 0o755  # no setuid, no g+w
    assert (tree / "sub" / "c.txt").read_bytes() == b"gamma"


def test_the_top_entry_can_take_a_new_name(python: str, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    res = extract(python, GOOD, dest, rename="copy")
    assert res["ok"], res
    assert (dest / "copy" / "sub" / "b.txt").read_bytes() == b"beta"
    assert (dest / "copy" / "hard").read_bytes() == b"alpha"  # its link renamed too


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_member_refuses_the_whole_archive_and_writes_nothing(
    python: str, tmp_path: Path, case: str
) -> None:
    data = archive(member("tree", type=tarfile.DIRTYPE, mode=0o755), member("tree/ok"),
                   HOSTILE[case])  # fmt: skip
    dest = tmp_path / "out" / "into"
    res = extract(python, data, dest)
    assert not res["ok"], res
    assert res["files"] == [], res  # not even the good members before it
    assert not (tmp_path / "evil").exists()
