"""The daemon's own git reader against repositories real git made: loose
objects, packs with delta chains, SHA-256 repositories, index versions 2-4,
skip-worktree entries, alternates and linked worktrees; and altered objects."""

from __future__ import annotations

import subprocess
import zlib
from pathlib import Path

import pytest

from sandman.daemon import gitindex, gitread
from tests.unit.daemon.helpers import git


def _repo(path: Path, *init: str) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main", *init)
    return path


def _every_blob(repo: Path) -> dict[str, bytes]:
    """Every blob of every commit, as git itself reads them."""
    out = {}
    listing = git(repo, "rev-list", "--objects", "--all").split("\n")
    for line in listing:
        oid = line.split(" ")[0]
        if oid and git(repo, "cat-file", "-t", oid).strip() == "blob":
            out[oid] = subprocess.run(
                ["git", "-C", str(repo), "cat-file", "blob", oid], capture_output=True, check=True
            ).stdout
    return out


@pytest.mark.parametrize("fmt", ["sha1", "sha256"])
def test_blobs_from_loose_objects_and_deep_delta_chains(tmp_path: Path, fmt: str) -> None:
    repo = _repo(tmp_path / "r", f"--object-format={fmt}")
    text = "".join(f"line {i}\n" for i in range(2000))
    for i in range(40):  # one file edited many times: packs store it as deltas
        text = text.replace(f"line {i * 7}\n", f"edited {i}\n")
        (repo / "big.txt").write_text(text)
        (repo / f"f{i % 5}.bin").write_bytes(bytes([i]) * (1000 + i))
        git(repo, "add", "-A")
        git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"c{i}")
    loose = _every_blob(repo)
    gd = gitindex.git_dir_of(repo)
    assert gd is not None and gitindex.hash_name(gd) == fmt
    store = gitread.ObjectStore(gd / "objects", fmt)
    assert {oid: store.blob(oid) for oid in loose} == loose
    store.close()
    git(repo, "gc", "-q", "--aggressive")  # now everything is in one pack, deltified
    assert not list((gd / "objects").glob("??/*"))
    store = gitread.ObjectStore(gd / "objects", fmt)
    assert {oid: store.blob(oid) for oid in loose} == loose
    store.close()
    commit, branch = gitindex.read_head(gd)  # from packed-refs after gc
    assert branch == "main" and commit == git(repo, "rev-parse", "HEAD").strip()


@pytest.mark.parametrize("version", ["2", "3", "4"])
def test_index_versions_and_skip_worktree(tmp_path: Path, version: str) -> None:
    repo = _repo(tmp_path / "r")
    for name in ("a.txt", "dir/b.txt", "dir/sub/c.txt", "dir/sub/d-long-name.txt"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(name)
    (repo / "link").symlink_to("a.txt")
    git(repo, "add", "-A")
    git(repo, "update-index", "--index-version", version)
    if version == "3":
        git(repo, "update-index", "--skip-worktree", "dir/b.txt")
    entries = gitindex.read_index(repo / ".git" / "index")
    want = {
        line.split("\t")[1]: line.split(" ")[1] for line in git(repo, "ls-files", "-s").splitlines()
    }
    if version == "3":
        del want["dir/b.txt"]  # not in the worktree's care
    assert {e.path: e.oid for e in entries} == want
    assert {e.path: e.mode for e in entries}["link"] == 0o120000


def test_an_altered_object_or_a_non_blob_is_refused(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "r")
    (repo / "a.txt").write_text("real\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    oid = git(repo, "rev-parse", "HEAD:a.txt").strip()
    path = repo / ".git" / "objects" / oid[:2] / oid[2:]
    path.chmod(0o644)
    path.write_bytes(zlib.compress(b"blob 5\0fake\n"))
    store = gitread.ObjectStore(repo / ".git" / "objects")
    with pytest.raises(gitindex.GitReadError, match="does not hash to its id"):
        store.blob(oid)
    with pytest.raises(gitindex.GitReadError, match="not a blob"):
        store.blob(git(repo, "rev-parse", "HEAD").strip())
    with pytest.raises(gitindex.GitReadError, match="not in the repository"):
        store.blob("0" * 40)


def test_alternates_and_linked_worktrees(tmp_path: Path) -> None:
    origin = _repo(tmp_path / "origin")
    (origin / "a.txt").write_text("shared\n")
    git(origin, "add", "-A")
    git(origin, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", str(origin), str(clone)], check=True)
    oid = git(clone, "rev-parse", "HEAD:a.txt").strip()
    store = gitread.ObjectStore(clone / ".git" / "objects")  # the blob is only in origin
    assert store.blob(oid) == b"shared\n"
    wt = tmp_path / "wt"
    git(origin, "worktree", "add", "-q", "-b", "side", str(wt))
    gd = gitindex.git_dir_of(wt)
    assert gd is not None and (gd / "commondir").is_file()
    assert gitindex.read_head(gd) == (git(origin, "rev-parse", "HEAD").strip(), "side")
    common = gitindex.common_dir(gd)
    assert gitread.ObjectStore(common / "objects").blob(oid) == b"shared\n"
