"""References, platform selection in indexes, image configs (pure)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sandman.oci import (
    MAX_ARGV_BYTES,
    MAX_ARGV_WORD_BYTES,
    MAX_ARGV_WORDS,
    MAX_WORKING_DIR_BYTES,
    BadManifest,
    ConfigTooLarge,
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
    assert cfg == ImageConfig(entrypoint=("/e",), cmd=None, working_dir="/w")
    assert ImageConfig.from_blob({"config": {"Cmd": []}}).cmd == ()
    with pytest.raises(BadManifest, match="Entrypoint is not a list of strings"):
        ImageConfig.from_blob({"config": {"Entrypoint": "sh -c x"}})


# -- what an image config may cost --------------------------------------------------
def _config(**fields: object) -> bytes:
    return json.dumps({"os": "linux", "config": fields}).encode()


def test_only_the_fields_the_patch_needs_are_kept() -> None:
    # Env, User, Labels, history: read by nobody in Sandman, so never kept (the
    # webhook caches what this returns for every image it has seen).
    blob = _config(Entrypoint=["/e"], Cmd=["c"], WorkingDir="/w", Env=["A=1"] * 10_000, User="7")
    cfg = ImageConfig.from_bytes(blob)
    assert [f.name for f in dataclasses.fields(cfg)] == ["entrypoint", "cmd", "working_dir"]
    assert cfg == ImageConfig(("/e",), ("c",), "/w")


@pytest.mark.parametrize(
    ("entrypoint", "cmd", "match"),
    [
        # 200 + 57 = 257 words > 256 (each list alone is under the cap)
        (["e"] * 200, ["c"] * 57, r"Entrypoint\+Cmd has 257 words, over the 256"),
        # one list alone: refused before its words are looked at
        ([], ["c"] * 100_000, r"Cmd has 100000 words, over the 256"),
        # one word of 16 KiB + 1 byte
        (["/bin/sh"], ["x" * (16 * 1024 + 1)], r"16385-byte word, over the 16384 bytes per word"),
        # bytes, not characters: 5,462 three-byte characters = 16,386 bytes > 16,384
        ([], ["\u20ac" * 5462], r"16386-byte word"),
        # 5 words of 16,384 bytes = 81,920 bytes > 65,536 (each word is at its cap)
        ([], ["x" * 16384] * 5, r"Entrypoint\+Cmd is 81920 bytes, over the 65536"),
    ],
)
def test_argv_over_the_caps_is_refused_with_the_fix(
    entrypoint: list[str], cmd: list[str], match: str
) -> None:
    with pytest.raises(ConfigTooLarge, match=match) as e:
        ImageConfig.from_bytes(_config(Entrypoint=entrypoint, Cmd=cmd))
    assert "give the container an explicit `command`" in str(e.value)


def test_argv_at_the_caps_is_kept() -> None:
    # 4 words of 16,384 bytes = 65,536 bytes (= MAX_ARGV_BYTES), plus 252 empty words:
    # 256 words (= MAX_ARGV_WORDS); every cap reached, none passed
    assert (MAX_ARGV_WORDS, MAX_ARGV_WORD_BYTES, MAX_ARGV_BYTES) == (256, 16384, 65536)
    cmd = ["x" * 16384] * 4 + [""] * 252
    cfg = ImageConfig.from_bytes(_config(Cmd=cmd))
    assert cfg.cmd is not None and len(cfg.cmd) == 256
    # a lone surrogate (valid JSON, no valid UTF-8) is counted, not a crash
    assert ImageConfig.from_bytes(b'{"config": {"Cmd": ["\\ud800"]}}').cmd == ("\ud800",)


def test_working_dir_is_a_bounded_string() -> None:
    assert MAX_WORKING_DIR_BYTES == 4096  # PATH_MAX
    assert ImageConfig.from_bytes(_config(WorkingDir="/" * 4096)).working_dir == "/" * 4096
    with pytest.raises(BadManifest, match="WorkingDir is over 4096 bytes"):
        ImageConfig.from_bytes(_config(WorkingDir="/" * 4097))
    # once stringified whatever it was: a 1 MB list became a 1 MB string
    with pytest.raises(BadManifest, match="WorkingDir is not a string"):
        ImageConfig.from_bytes(_config(WorkingDir=["/a"] * 10))


def test_deep_nesting_is_a_bad_manifest_not_a_crash() -> None:
    # 100,000 nested arrays (200 KB) exceed the decoder's recursion limit: a
    # RecursionError, which no caller expects, became an admission error
    with pytest.raises(BadManifest, match="nested too deeply"):
        ImageConfig.from_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(BadManifest, match="not JSON"):
        ImageConfig.from_bytes(b"{")


def test_the_reason_a_pod_author_reads_states_the_caps_enforced() -> None:
    from sandman.registry import MAX_CONFIG_BYTES

    r = ConfigTooLarge.REASON  # fixed text, shown in the denial (webhook/lookup_rules.py)
    assert f"at most {MAX_ARGV_WORDS} words, {MAX_ARGV_WORD_BYTES >> 10} KiB each" in r
    assert f"{MAX_ARGV_BYTES >> 10} KiB in all" in r
    assert f"WORKDIR at most {MAX_WORKING_DIR_BYTES >> 10} KiB" in r
    assert f"the config at most {MAX_CONFIG_BYTES >> 20} MiB" in r
    assert "explicit `command`" in r
