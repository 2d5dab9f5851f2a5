"""The install path from a wheel, as a platform team takes it: no checkout.

A wheel built from this tree is installed (with its dependencies, from PyPI)
into a venv outside the checkout, and every command below runs from that
venv with the working directory elsewhere and a fresh image cache: `sandman
image build`, `sandman image push` of every component to a registry that
wants credentials (htpasswd basic auth over TLS, Debian's docker-registry),
the same push without credentials (refused, saying what to do), `sandman
image export`, and `sandman install --dry-run=client`. The registry then
serves the manifests the push printed. The packaged monitoring overlay
renders with its dashboard. No cluster is needed.

The scheduler image wraps the harness's kube-scheduler build; this test
links the harness's cached build into the fresh cache rather than spend
minutes compiling Kubernetes again (`make test` builds it first).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sandman import __version__
from sandman.harness.cluster.binaries import binary_sets, build_set
from sandman.harness.cluster.config import Versions, default_cache_dir
from sandman.harness.images import registry as reg
from sandman.install.images import COMPONENTS
from tests.wheel import REPO, ok, runner, wheel_venv

USER, PASSWORD = "platform", "pushing-is-a-privilege"
PREFIX = "acme/sandman"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the wheel installed (tests/wheel.py)."""
    return wheel_venv(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("user")


@pytest.fixture(scope="module")
def sandman(venv: Path, workdir: Path):  # type: ignore[no-untyped-def]
    """Run the venv's `sandman` from outside the checkout, with a fresh cache."""
    home, cache = workdir / "home", workdir / "cache"
    home.mkdir()
    # The harness's kube-scheduler build (see the module docstring).
    kube = next(bs for bs in binary_sets(Versions()) if bs.name == "kube")
    built = build_set(kube, default_cache_dir())
    (cache / "kube" / kube.version).mkdir(parents=True)
    (cache / "kube" / kube.version / "bin").symlink_to(built)

    return runner(venv, workdir, home, cache)


@pytest.fixture(scope="module")
def registry(workdir: Path) -> Iterator[reg.Registry]:
    for tool in ("docker-registry", "skopeo"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing (python -m sandman.harness.prereqs installs it)")
    with reg.serve(workdir / "registry", username=USER, password=PASSWORD, tls=True) as r:
        yield r


def test_the_venv_runs_the_wheel_not_the_checkout(venv: Path, workdir: Path) -> None:
    code = "import sandman, sandman.harness.cli.image as m; print(sandman.__file__, m.__file__)"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True, text=True, check=True, cwd=workdir, env={"PATH": "/usr/bin:/bin"},
    ).stdout  # fmt: skip
    for path in out.split():
        assert Path(path).is_relative_to(venv), path
        assert not Path(path).is_relative_to(REPO), path


def test_build_then_push_every_component_to_a_registry_with_auth(sandman, registry) -> None:  # type: ignore[no-untyped-def]
    out = ok(sandman("image", "build", "--no-push", "daemon"))
    assert out.startswith("daemon") and " sha256:" in out
    # The documented command: every component, credentials on stdin.
    target = f"{registry.host}/{PREFIX}"
    out = ok(
        sandman("image", "push", "--registry", target, "--username", USER, "--password-stdin",
                "--ca-file", str(registry.ca_file), stdin=PASSWORD + "\n")
    )  # fmt: skip
    pushed = {line.split()[0]: line.split()[1] for line in out.splitlines()}
    assert set(pushed) == {f"{target}/sandman-{c}:{__version__}" for c in COMPONENTS}
    # The registry serves what the push printed: pulled back with the credentials.
    for c in COMPONENTS:
        repo = f"{PREFIX}/sandman-{c}"
        assert (
            registry.manifest_digest(repo, __version__)
            == pushed[f"{registry.host}/{repo}:{__version__}"]
        )


def test_push_with_an_auth_file(sandman, registry, workdir: Path) -> None:  # type: ignore[no-untyped-def]
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    config = workdir / "docker-config.json"
    config.write_text(json.dumps({"auths": {registry.host: {"auth": token}}}))
    target = f"{registry.host}/{PREFIX}-authfile"
    out = ok(sandman("image", "push", "daemon", "--registry", target, "--authfile", str(config),
                      "--ca-file", str(registry.ca_file)))  # fmt: skip
    ref, digest = out.split()[:2]
    assert ref == f"{target}/sandman-daemon:{__version__}"
    assert registry.manifest_digest(f"{PREFIX}-authfile/sandman-daemon", __version__) == digest


def test_push_without_credentials_is_refused_clearly(sandman, registry) -> None:  # type: ignore[no-untyped-def]
    target = f"{registry.host}/{PREFIX}-anonymous"
    proc = sandman("image", "push", "daemon", "--registry", target, "--ca-file",
                   str(registry.ca_file))  # fmt: skip
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "authentication required" in proc.stderr
    assert "--username USER --password-stdin" in proc.stderr
    anonymous = reg.Registry(registry.host, ca_file=registry.ca_file)
    assert anonymous.status() == 401
    assert registry.manifest_digest(f"{PREFIX}-anonymous/sandman-daemon", __version__) is None


def test_a_missing_tool_is_named_before_anything_is_built(sandman, venv: Path) -> None:  # type: ignore[no-untyped-def]
    # Only the venv on PATH: no skopeo, no ldd.
    proc = sandman("image", "push", "daemon", "--registry", "127.0.0.1:9",
                   path=str(venv / "bin"))  # fmt: skip
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "`sandman image push` cannot run here: missing" in proc.stderr
    assert "skopeo: " in proc.stderr and "apt-get install skopeo" in proc.stderr


def test_export_writes_a_docker_archive(sandman, workdir: Path) -> None:  # type: ignore[no-untyped-def]
    out_dir = workdir / "archives"
    ok(sandman("image", "export", "daemon", "-o", str(out_dir)))
    archive = out_dir / f"sandman-daemon-{__version__}.tar"
    with tarfile.open(archive) as t:
        manifest = json.load(t.extractfile("manifest.json"))  # type: ignore[arg-type]
    # The name as a container runtime spells a bare one (what `kind load` keeps).
    assert manifest[0]["RepoTags"] == [f"docker.io/library/sandman-daemon:{__version__}"]


def test_install_dry_run_renders_with_the_pushed_images(sandman, registry) -> None:  # type: ignore[no-untyped-def]
    kube = next(bs for bs in binary_sets(Versions()) if bs.name == "kube")
    kubectl = build_set(kube, default_cache_dir()) / "kubectl"
    target = f"{registry.host}/{PREFIX}"
    out = ok(sandman("install", "--registry", target, "--allow-registry", "docker.io/*",
                      "--dry-run=client", "-o", "yaml", "--kubectl", str(kubectl)))  # fmt: skip
    text = yaml.safe_dump_all(list(yaml.safe_load_all(out)))
    for c in ("controller", "daemon"):
        assert f"{target}/sandman-{c}:{__version__}" in text


def test_the_packaged_monitoring_overlay_has_its_dashboard(venv: Path) -> None:
    kube = next(bs for bs in binary_sets(Versions()) if bs.name == "kube")
    kubectl = build_set(kube, default_cache_dir()) / "kubectl"
    (site,) = venv.glob("lib/python3*/site-packages")
    monitoring = site / "sandman" / "manifests" / "monitoring"
    out = subprocess.run(
        [str(kubectl), "kustomize", str(monitoring)],
        capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]},
    ).stdout  # fmt: skip
    (dashboard,) = [
        d for d in yaml.safe_load_all(out) if d and d["metadata"]["name"] == "sandman-dashboard"
    ]
    assert json.loads(dashboard["data"]["sandman-dashboard.json"])["panels"]
