"""References, platform selection in indexes, image configs (pure)."""

from __future__ import annotations

import pytest

from sandman.oci import (
    BadManifest,
    ImageConfig,
    InvalidReference,
    NoMatchingPlatform,
    Platform,
    Reference,
    plain_http,
    select_manifest,
)

D = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("text", "domain", "path", "tag", "digest"),
    [
        ("busybox", "docker.io", "library/busybox", None, None),
        ("index.docker.io/foo/bar:1", "docker.io", "foo/bar", "1", None),
        ("127.0.0.1:5000/sandman/tiny:1", "127.0.0.1:5000", "sandman/tiny", "1", None),
        ("localhost/x", "localhost", "x", None, None),
        (f"ghcr.io/a/b:v2@{D}", "ghcr.io", "a/b", "v2", D),
        # host:port is a registry, never a tag
        ("reg:5000/app", "reg:5000", "app", None, None),
    ],
)
def test_reference_normalisation(text: str, domain: str, path: str, tag: str, digest: str) -> None:
    r = Reference.parse(text)
    assert (r.domain, r.path, r.tag, r.digest) == (domain, path, tag, digest)


def test_reference_parts() -> None:
    r = Reference.parse("nginx")
    assert r.manifest_ref == "latest" and r.api_host == "registry-1.docker.io"
    assert str(r) == "docker.io/library/nginx"
    pinned = r.with_digest(D)
    assert pinned.manifest_ref == D and str(pinned) == f"docker.io/library/nginx@{D}"


@pytest.mark.parametrize("bad", ["", "Upper:1", "a/b@sha256:short", "a/b:bad tag", "a//b"])
def test_bad_references_say_what_is_wrong(bad: str) -> None:
    with pytest.raises(InvalidReference):
        Reference.parse(bad)


def test_plain_http_only_for_loopback_and_listed_hosts() -> None:
    assert (
        plain_http("127.0.0.1:5000") and plain_http("localhost:5000") and plain_http("[::1]:5000")
    )
    assert not plain_http("10.0.0.5:5000") and not plain_http("ghcr.io")
    assert plain_http("registry.local:5000", insecure={"registry.local:5000"})


def _entry(arch: str, os_: str = "linux", variant: str | None = None, n: str = "1") -> dict:
    p = {"os": os_, "architecture": arch}
    if variant:
        p["variant"] = variant
    return {"digest": f"sha256:{n * 64}", "platform": p}


def test_index_selection_takes_linux_amd64() -> None:
    index = {
        "manifests": [
            _entry("arm64", variant="v8", n="1"),
            _entry("unknown", os_="unknown", n="2"),  # an attestation manifest
            _entry("amd64", n="3"),
            _entry("amd64", os_="windows", n="4"),
        ]
    }
    assert select_manifest(index)["digest"] == "sha256:" + "3" * 64


def test_index_selection_prefers_the_exact_variant_then_the_first() -> None:
    index = {"manifests": [_entry("arm", variant="v6", n="1"), _entry("arm", variant="v7", n="2")]}
    assert select_manifest(index, Platform("linux", "arm", "v7"))["digest"].endswith("2" * 64)
    # no exact variant: the first of the right os/arch (containerd's fallback)
    assert select_manifest(index, Platform("linux", "arm", "v5"))["digest"].endswith("1" * 64)


def test_index_without_the_platform_lists_what_it_has() -> None:
    index = {"manifests": [_entry("arm64", n="1"), _entry("s390x", n="2")]}
    with pytest.raises(
        NoMatchingPlatform, match=r"no linux/amd64 image \(has: linux/arm64, linux/s390x\)"
    ):
        select_manifest(index)


def test_image_config_keeps_unset_apart_from_empty() -> None:
    cfg = ImageConfig.from_blob(
        {
            "os": "linux",
            "architecture": "amd64",
            "config": {"Entrypoint": ["/e"], "Cmd": None, "WorkingDir": "/w", "User": "1000:1000"},
        }
    )
    assert cfg.entrypoint == ("/e",) and cfg.cmd is None
    assert (cfg.working_dir, cfg.user, cfg.os) == ("/w", "1000:1000", "linux")
    assert ImageConfig.from_blob({"config": {"Cmd": []}}).cmd == ()
    with pytest.raises(BadManifest, match="Entrypoint is not a list of strings"):
        ImageConfig.from_blob({"config": {"Entrypoint": "sh -c x"}})
