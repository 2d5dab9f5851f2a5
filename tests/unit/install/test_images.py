"""Image names and the one version: what `sandman image push` and `sandman install` agree on."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sandman import __version__
from sandman.install.images import COMPONENTS, ImageNameError, Registry, check_version

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"


@pytest.mark.parametrize(
    ("text", "host", "prefix"),
    [
        ("ghcr.io/myorg", "ghcr.io", "myorg"),
        ("ghcr.io/myorg/sandbox/", "ghcr.io", "myorg/sandbox"),
        ("127.0.0.1:5000", "127.0.0.1:5000", ""),
        ("localhost:5000/x", "localhost:5000", "x"),
        ("registry.example.com", "registry.example.com", ""),
        ("[::1]:5000/a", "[::1]:5000", "a"),
    ],
)
def test_registry_parses(text: str, host: str, prefix: str) -> None:
    r = Registry.parse(text)
    assert (r.host, r.prefix) == (host, prefix)
    assert r.ref("controller", "1.2.3") == f"{r}/sandman-controller:1.2.3"


@pytest.mark.parametrize(
    "text",
    [
        "https://ghcr.io/x",  # a scheme: HTTP is --insecure's choice, never a URL's
        "myorg",  # no dot, no port: a Docker Hub namespace, not a registry
        "ghcr.io/MyOrg",  # path parts are lowercase
        "ghcr.io//x",
    ],
)
def test_registry_refuses(text: str) -> None:
    with pytest.raises(ImageNameError):
        Registry.parse(text)


@pytest.mark.parametrize(
    ("text", "loopback"),
    [("127.0.0.1:5000", True), ("localhost:5000", True), ("[::1]:5000", True),
     ("10.244.0.1:5000", False), ("ghcr.io", False)],
)  # fmt: skip
def test_loopback(text: str, loopback: bool) -> None:
    assert Registry.parse(text).loopback is loopback


@pytest.mark.parametrize("bad", ["", ".1", "-x", "a b", "x" * 129, "1:2"])
def test_version_must_be_a_tag(bad: str) -> None:
    with pytest.raises(ImageNameError):
        check_version(bad)


def test_manifests_name_the_release_tag_for_every_component() -> None:
    # `sandman image build` tags with the release by default; applied as is,
    # the manifests must name exactly those tags.
    doc = yaml.safe_load((MANIFESTS / "default" / "kustomization.yaml").read_text())
    tags = {i["name"]: i["newTag"] for i in doc["images"]}
    assert tags == {f"sandman-{c}": __version__ for c in COMPONENTS}


def test_manifests_use_only_placeholders_for_our_images() -> None:
    # Every image of ours in the manifests is a placeholder an overlay can rename.
    found = set()
    for path in MANIFESTS.rglob("deployment.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            for c in doc["spec"]["template"]["spec"]["containers"]:
                found.add(c["image"])
    assert found == {"sandman-controller", "sandman-scheduler"}
