"""Image architectures: `--arch` parsing, the config's platform, the index a
multi-architecture push writes, and which entry a node of each platform pulls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandman.harness.images import platforms
from sandman.harness.images.oci import (
    MEDIA_INDEX,
    BlobStore,
    ImageConfig,
    Layer,
    assemble,
    assemble_index,
    index_json,
    layer_from_dir,
)
from sandman.harness.images.platforms import AMD64, ARM64
from sandman.harness.images.push import write_oci_layout
from sandman.oci import NoMatchingPlatform, Platform, select_manifest


# -- --arch ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "want"),
    [
        (None, ("amd64",)),  # the host's (x86_64 below)
        ("", ("amd64",)),
        ("arm64", ("arm64",)),
        ("amd64,arm64", ("amd64", "arm64")),
        ("arm64, amd64", ("arm64", "amd64")),  # the order given is the index's
        ("arm64,arm64,amd64", ("arm64", "amd64")),  # each once
    ],
)
def test_parse_arches(text: str | None, want: tuple[str, ...]) -> None:
    got = platforms.parse_arches(text, default=platforms.host("x86_64"))
    assert tuple(a.name for a in got) == want


def test_unknown_arch_names_the_known_ones() -> None:
    with pytest.raises(platforms.UnknownArch, match="known: amd64, arm64"):
        platforms.parse_arches("amd64,riscv64")
    with pytest.raises(platforms.UnknownArch, match="s390x"):
        platforms.host("s390x")


def test_host_arch_from_machine() -> None:
    assert platforms.host("x86_64") is AMD64
    assert platforms.host("aarch64") is ARM64


def test_arch_facts() -> None:
    # What a build needs to place files: Debian's multiarch dir and the
    # loader's ABI path, as every ELF of that architecture names it.
    assert (AMD64.triplet, AMD64.loader_path) == (
        "x86_64-linux-gnu",
        "/lib64/ld-linux-x86-64.so.2",
    )
    assert (ARM64.triplet, ARM64.loader_path) == (
        "aarch64-linux-gnu",
        "/lib/ld-linux-aarch64.so.1",
    )
    assert AMD64.platform() == {"architecture": "amd64", "os": "linux"}
    assert ARM64.platform() == {"architecture": "arm64", "os": "linux", "variant": "v8"}


# -- the image config ----------------------------------------------------------------
def test_config_records_the_architecture() -> None:
    layers: list[Layer] = []
    amd = ImageConfig().to_json(layers)
    assert (amd["architecture"], amd["os"]) == ("amd64", "linux")
    # An amd64 config is what it was before images had an architecture: no
    # variant key, so its digest (and every node's cache of it) is unchanged.
    assert "variant" not in amd
    arm = ImageConfig(architecture="arm64", variant="v8").to_json(layers)
    assert (arm["architecture"], arm["os"], arm["variant"]) == ("arm64", "linux", "v8")


# -- the index -------------------------------------------------------------------------
@pytest.fixture
def two_images(tmp_path: Path):  # type: ignore[no-untyped-def]
    store = BlobStore(tmp_path / "blobs")
    images = {}
    for arch in (AMD64, ARM64):
        root = tmp_path / arch.name
        root.mkdir()
        (root / "hello").write_text(f"built for {arch.name}\n")
        cfg = ImageConfig(architecture=arch.name, variant=arch.variant)
        images[arch.name] = assemble([layer_from_dir(root, store)], cfg, store)
    return store, images


def test_index_lists_each_platform_once(two_images) -> None:  # type: ignore[no-untyped-def]
    store, images = two_images
    entries = [(AMD64.platform(), images["amd64"]), (ARM64.platform(), images["arm64"])]
    doc = index_json(entries)
    assert doc["mediaType"] == MEDIA_INDEX and doc["schemaVersion"] == 2
    assert [(m["platform"], m["digest"]) for m in doc["manifests"]] == [
        ({"architecture": "amd64", "os": "linux"}, images["amd64"].manifest.digest),
        (
            {"architecture": "arm64", "os": "linux", "variant": "v8"},
            images["arm64"].manifest.digest,
        ),
    ]
    with pytest.raises(ValueError, match="two images for platform linux/arm64/v8"):
        index_json([*entries, (ARM64.platform(), images["amd64"])])
    index = assemble_index(entries, store)
    assert json.loads(store.read(index.blob.digest)) == doc
    assert index.blob.media_type == MEDIA_INDEX


@pytest.mark.parametrize(
    ("node", "want"),
    [
        (Platform(architecture="amd64"), "amd64"),
        (Platform(architecture="arm64", variant="v8"), "arm64"),
        (Platform(architecture="arm64"), "arm64"),  # nodes that report no variant
    ],
)
def test_each_node_pulls_its_own(two_images, node: Platform, want: str) -> None:  # type: ignore[no-untyped-def]
    # The same selection the webhook's registry client makes (containerd's rule).
    _store, images = two_images
    doc = index_json([(AMD64.platform(), images["amd64"]), (ARM64.platform(), images["arm64"])])
    assert select_manifest(doc, node)["digest"] == images[want].manifest.digest


def test_a_single_arch_index_refuses_other_nodes(two_images) -> None:  # type: ignore[no-untyped-def]
    _store, images = two_images
    doc = index_json([(AMD64.platform(), images["amd64"])])
    with pytest.raises(NoMatchingPlatform, match="has: linux/amd64"):
        select_manifest(doc, Platform(architecture="arm64"))


def test_oci_layout_of_an_index_holds_every_image(two_images, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store, images = two_images
    index = assemble_index(
        [(AMD64.platform(), images["amd64"]), (ARM64.platform(), images["arm64"])], store
    )
    ref = write_oci_layout(index, store, "1.2.3", tmp_path / "layout")
    assert ref == f"oci:{tmp_path / 'layout'}:1.2.3"
    top = json.loads((tmp_path / "layout" / "index.json").read_text())
    (entry,) = top["manifests"]
    assert (entry["mediaType"], entry["digest"]) == (MEDIA_INDEX, index.blob.digest)
    assert entry["annotations"] == {"org.opencontainers.image.ref.name": "1.2.3"}
    have = {p.name for p in (tmp_path / "layout" / "blobs" / "sha256").iterdir()}
    want = {index.blob.digest}
    for img in images.values():
        want |= {img.manifest.digest, img.config.digest, *(la.blob.digest for la in img.layers)}
    assert have == {d.split(":", 1)[1] for d in want}


def test_oci_layout_of_one_image_is_unchanged(two_images, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store, images = two_images
    img = images["amd64"]
    write_oci_layout(img, store, "1", tmp_path / "one")
    top = json.loads((tmp_path / "one" / "index.json").read_text())
    assert top["manifests"] == [
        {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": img.manifest.digest,
            "size": img.manifest.size,
            "annotations": {"org.opencontainers.image.ref.name": "1"},
        }
    ]


# -- recipes per architecture ----------------------------------------------------------
def test_component_configs_carry_their_arch() -> None:
    from sandman.harness.images import components, controller

    arm = components.config("daemon", ARM64)
    assert (arm.architecture, arm.variant) == ("arm64", "v8")
    # amd64: the config as it always was (so are its bytes and digest).
    assert components.config("controller", AMD64) == controller.CONFIG


def test_the_local_clusters_images_are_built_for_the_host_only() -> None:
    from sandman.harness.images.build import ImageBuildError, recipe

    other = ARM64 if platforms.host() == AMD64 else AMD64
    with pytest.raises(ImageBuildError, match=f"image tiny is built for .*--arch {other}"):
        recipe("tiny", arch=other)
    assert recipe("tiny", arch=platforms.host()).name == "tiny"


def test_wheel_platforms_per_arch() -> None:
    from sandman.harness.images import controller

    # x86_64: the tags the image was always built with.
    assert (
        controller.wheel_platforms(AMD64)
        == controller.WHEEL_PLATFORMS
        == (
            "manylinux_2_36_x86_64",
            "manylinux_2_34_x86_64",
            "manylinux_2_28_x86_64",
            "manylinux_2_17_x86_64",
            "manylinux2014_x86_64",
            "manylinux_2_5_x86_64",
            "manylinux1_x86_64",
        )
    )
    assert "manylinux2014_aarch64" in controller.wheel_platforms(ARM64)
    assert "manylinux_2_17_aarch64" in controller.wheel_platforms(ARM64)


def test_the_lock_holds_a_wheel_per_arch() -> None:
    from sandman.harness.images import controller

    hashes = {}
    for line in controller.LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            pin, *flags = line.split()
            hashes[pin.split("==")[0]] = [f for f in flags if f.startswith("--hash=sha256:")]
    # Compiled wheels differ per architecture; pure-Python ones serve both.
    for compiled in ("cryptography", "aiohttp", "pyyaml", "cffi"):
        assert len(hashes[compiled]) == 2, compiled
    for pure in ("idna", "attrs", "typing-extensions"):
        assert len(hashes[pure]) == 1, pure
