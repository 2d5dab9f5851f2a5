"""`sandman image push --arch amd64,arm64` writes one index per image to a real
registry, and each node pulls its own platform's manifest from it.

A plain-HTTP docker-registry (Debian's) on loopback; the push is the CLI's, as
a user types it. The registry then serves, under the tag, an OCI index with
one entry per architecture, each entry's manifest and config (architecture,
os) as built. `export` writes one docker archive per architecture. The
daemon image is used: its arm64 tree comes from Debian's arm64 packages
(cached; tests/e2e/test_daemon_arm64.py runs it under qemu-user). No cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sandman.harness.cluster.process import ManagedProcess, wait_until
from sandman.harness.testing import free_port
from sandman.oci import Platform, select_manifest

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
VERSION = "0.0.0-multiarch"
REPO = "multi/sandman-daemon"

# Builds arm64 as "the other architecture" (its tree runs under qemu-user).
pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64", reason="an x86_64 host")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for tool in ("docker-registry", "skopeo"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing (python -m sandman.harness.prereqs installs it)")
    root = tmp_path_factory.mktemp("registry")
    host = f"127.0.0.1:{free_port()}"
    config = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
        "http": {"addr": host},
    }
    (root / "config.yml").write_text(yaml.safe_dump(config))
    proc = ManagedProcess(
        "multiarch-registry",
        ("docker-registry", "serve", str(root / "config.yml")),
        root / "run",
        root / "logs",
        stop_timeout_s=5,
    )
    proc.start()

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://{host}/v2/", timeout=2) as r:
                return int(r.status) == 200
        except OSError:
            return False

    try:
        wait_until(proc, answers, timeout_s=30, what="serving")
        yield host
    finally:
        proc.stop()


def _get(host: str, path: str, accept: str) -> tuple[str, bytes]:
    req = urllib.request.Request(f"http://{host}/v2/{path}", headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=30) as r:
        return str(r.headers.get("Content-Type")), r.read()


def _sandman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandman.cli.main", "image", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_push_writes_an_index_each_node_pulls_its_own(registry: str) -> None:
    proc = _sandman(
        "push", "daemon", f"--registry={registry}/multi", f"--version={VERSION}",
        "--arch=amd64,arm64",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "index: amd64" in proc.stdout and "arm64" in proc.stdout, proc.stdout

    ctype, body = _get(registry, f"{REPO}/manifests/{VERSION}", f"{INDEX}, {MANIFEST}")
    index = json.loads(body)
    assert ctype == INDEX and index["mediaType"] == INDEX, (ctype, index)
    platforms = [m["platform"] for m in index["manifests"]]
    assert platforms == [
        {"architecture": "amd64", "os": "linux"},
        {"architecture": "arm64", "os": "linux", "variant": "v8"},
    ]
    for node, arch in (
        (Platform(architecture="amd64"), "amd64"),
        (Platform(architecture="arm64", variant="v8"), "arm64"),
    ):
        entry = select_manifest(index, node)
        ctype, body = _get(registry, f"{REPO}/manifests/{entry['digest']}", MANIFEST)
        manifest = json.loads(body)
        _, cfg = _get(registry, f"{REPO}/blobs/{manifest['config']['digest']}", "*/*")
        config = json.loads(cfg)
        assert (config["architecture"], config["os"]) == (arch, "linux")


def test_build_pushes_an_index_to_a_loopback_registry(registry: str) -> None:
    # `sandman image build` (the local cluster's path) pushes one too.
    proc = _sandman(
        "build", "daemon", f"--registry={registry}", "--version=0.0.0-build", "--arch=arm64,amd64"
    )
    assert proc.returncode == 0, proc.stderr
    _, body = _get(registry, "sandman-daemon/manifests/0.0.0-build", f"{INDEX}, {MANIFEST}")
    archs = [m["platform"]["architecture"] for m in json.loads(body)["manifests"]]
    assert archs == ["arm64", "amd64"]  # the order given


def test_export_writes_one_archive_per_arch(tmp_path: Path) -> None:
    proc = _sandman(
        "export", "daemon", f"--version={VERSION}", "--arch=amd64,arm64", "-o", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr
    for arch in ("amd64", "arm64"):
        archive = tmp_path / f"sandman-daemon-{VERSION}-{arch}.tar"
        with tarfile.open(archive) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
            config = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
        assert config["architecture"] == arch, archive
        # skopeo names it as docker would (docker.io/library/...): one tag, both arches.
        assert manifest[0]["RepoTags"][0].endswith(f"/sandman-daemon:{VERSION}")


def test_the_local_clusters_own_images_say_they_are_one_arch_only() -> None:
    proc = _sandman("build", "--no-push", "--arch=arm64", "tiny")
    assert proc.returncode == 1
    assert "image tiny is built for this machine's architecture (amd64) only" in proc.stderr
