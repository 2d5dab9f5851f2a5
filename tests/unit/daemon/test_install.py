"""`sandmand install`: the per-pod copy and the shared node directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandman.daemon import install


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    rt = tmp_path / "image" / "rt"
    (rt / "bin").mkdir(parents=True)
    (rt / "bin" / "sandmand").write_bytes(b"\x7fELF")
    (rt / "bin" / "sandmand").chmod(0o755)
    (rt / "lib").mkdir()
    (rt / "lib" / "libc.so.6").write_bytes(b"libc")
    (rt / "VERSION").write_text("0.1.0 abc123\n")
    monkeypatch.setattr(install, "runtime_root", lambda: rt)
    return rt


def test_copy_mode_copies_the_tree_into_the_pod(tree: Path, tmp_path: Path) -> None:
    dest = tmp_path / "pod"
    dest.mkdir()
    where, copied = install.install(str(dest))
    assert (where, copied) == (dest / "rt", True)
    assert (dest / "rt" / "bin" / "sandmand").read_bytes() == b"\x7fELF"
    assert not (dest / "rt").is_symlink()


def test_shared_mode_installs_once_read_only_and_links_each_pod(tree: Path, tmp_path: Path) -> None:
    node = tmp_path / "node"
    pods = [tmp_path / "pod-a", tmp_path / "pod-b"]
    results = []
    for pod in pods:
        pod.mkdir()
        results.append(install.install(str(pod), str(node)))
    assert results == [(node / "abc123" / "rt", True), (node / "abc123" / "rt", False)]
    for pod in pods:
        # The sandbox sees the node directory at /.sandman/shared.
        assert os.readlink(pod / "rt") == "/.sandman/shared/abc123/rt"
    shared = node / "abc123" / "rt"
    for p in [shared, *shared.rglob("*")]:
        assert not stat.S_IMODE(p.lstat().st_mode) & 0o222, p  # no write bit anywhere
    assert stat.S_IMODE((shared / "bin" / "sandmand").stat().st_mode) == 0o555
    assert not list(node.glob("abc123/.rt.tmp-*"))  # no leftovers


def test_a_concurrent_installer_that_lost_the_race_drops_its_copy(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = tmp_path / "node"
    pod = tmp_path / "pod"
    pod.mkdir()
    real_rename = os.rename

    def other_pod_wins(src: str, dst: str) -> None:
        # Another pod's installer renames its complete tree into place first.
        if not Path(dst).exists():
            monkeypatch.setattr(os, "rename", real_rename)
            install._copy_tree(tree, Path(dst), read_only=True)
        real_rename(src, dst)  # now fails: the target exists and is not empty

    monkeypatch.setattr(os, "rename", other_pod_wins)
    where, copied = install.install(str(pod), str(node))
    assert (where, copied) == (node / "abc123" / "rt", False)
    assert sorted(p.name for p in (node / "abc123").iterdir()) == ["rt"]


def test_the_node_installer_names_the_tree_for_the_image_the_webhook_injects(
    tree: Path, tmp_path: Path
) -> None:
    from sandman.contract import daemon_release
    from sandman.daemon.cli import main

    node, scratch = tmp_path / "node", tmp_path / "scratch"
    scratch.mkdir()
    image = "registry.example/sandman/daemon:1.2.3"
    for _ in range(2):  # a restarted installer: same tree, same name
        rc = main(["install", str(scratch), f"--shared={node}", f"--release-image={image}"])
        assert rc == 0
    release = node / "release" / daemon_release(image)
    # Relative: the kubelet resolves it on the node, where the directory is
    # not mounted at /.sandman/shared.
    assert os.readlink(release) == "../abc123/rt"
    assert (release / "bin" / "sandmand").read_bytes() == b"\x7fELF"
    assert not list((node / "release").glob(".*tmp*"))
    # Another image gets another name; the first stays for the pods using it.
    main(["install", str(scratch), f"--shared={node}", "--release-image=other:1"])
    assert sorted(p.name for p in (node / "release").iterdir()) == sorted(
        [daemon_release(image), daemon_release("other:1")]
    )


def test_a_release_name_needs_the_node_directory(tree: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--release-image needs --shared"):
        install.install(str(tmp_path), None, "abc")
    with pytest.raises(ValueError, match="letters and digits"):
        install.install(str(tmp_path), str(tmp_path / "node"), "../evil")
