"""The overlay `sandman install` writes (pure), and that kustomize renders it as meant."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sandman.install import apply as ap
from sandman.install import render
from sandman.install.images import Registry

KUBECTL = Path.home() / ".cache/sandman/kube/v1.34.4/bin/kubectl"


def test_images_name_registry_and_version() -> None:
    opts = render.InstallOptions(version="1.2.3", registry=Registry.parse("ghcr.io/acme"))
    assert render.images(opts) == [
        {"name": f"sandman-{c}", "newName": f"ghcr.io/acme/sandman-{c}", "newTag": "1.2.3"}
        for c in ("controller", "scheduler", "daemon")
    ]


def test_without_a_registry_names_stay_bare() -> None:
    opts = render.InstallOptions(version="1.2.3")
    assert all("newName" not in i for i in render.images(opts))


def test_cert_manager_is_a_component_and_the_base_is_the_copy() -> None:
    doc = render.kustomization(render.InstallOptions(version="1", cert_manager=True), "x")
    assert doc["resources"] == ["manifests"]
    assert doc["components"] == ["manifests/components/cert-manager"]
    local = render.kustomization(render.InstallOptions(version="1", base="overlays/local"), "x")
    assert local["resources"] == ["manifests/overlays/local"]


def test_header_marks_our_files() -> None:
    assert render.is_ours(render.header(render.InstallOptions(version="1"), "0.1.0"))
    assert not render.is_ours("apiVersion: kustomize.config.k8s.io/v1beta1\n")


def test_overlay_refuses_a_kustomization_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [mine]\n")
    with pytest.raises(ap.InstallError):
        ap.write_overlay(tmp_path, render.InstallOptions(version="1"))
    assert (tmp_path / "kustomization.yaml").read_text() == "resources: [mine]\n"


@pytest.mark.skipif(not KUBECTL.exists(), reason="the harness's kubectl is not built")
def test_rendered_overlay_renames_every_image_and_the_daemon_env(tmp_path: Path) -> None:
    opts = render.InstallOptions(
        version="9.9.9", registry=Registry.parse("reg.example/team"), cert_manager=True
    )
    ap.write_overlay(tmp_path / "ov", opts)
    argv = [str(KUBECTL), "kustomize", str(tmp_path / "ov")]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    images = set()
    for d in docs:
        if d["kind"] == "Deployment":
            images |= {c["image"] for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {
        "reg.example/team/sandman-controller:9.9.9",
        "reg.example/team/sandman-scheduler:9.9.9",
    }
    assert ap.daemon_image(docs) == "reg.example/team/sandman-daemon:9.9.9"
    hooks = [d for d in docs if d["kind"] in ap.WEBHOOK_KINDS]
    assert len(hooks) == 2
    for h in hooks:
        assert h["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
            "sandman-system/sandman-webhook"
        )
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    webhook = deployments["sandman-webhook"]
    args = webhook["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--tls-cert-file=/etc/sandman/tls/tls.crt" in args
    assert any(d["kind"] == "Certificate" for d in docs)
    # The copy carries no Python (it is package data, not code).
    assert not list((tmp_path / "ov" / "manifests").rglob("*.py"))
    shutil.rmtree(tmp_path / "ov")


@pytest.mark.skipif(not KUBECTL.exists(), reason="the harness's kubectl is not built")
@pytest.mark.parametrize("overlay", ["kind", "cert-manager", "local"])
def test_shipped_overlays_render(overlay: str) -> None:
    out = subprocess.run(
        [str(KUBECTL), "kustomize", str(ap.manifests_dir() / "overlays" / overlay)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "kind: Deployment" in out.stdout
