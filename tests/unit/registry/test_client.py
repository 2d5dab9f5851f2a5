"""The registry client against a registry on loopback: auth flows, indexes, failures."""

from __future__ import annotations

import base64
import json

import pytest

from sandman.harness.testing import free_port
from sandman.oci import DOCKER_MANIFEST
from sandman.registry import (
    BadManifest,
    ConfigTooLarge,
    ImageNotFound,
    Keychain,
    NoMatchingPlatform,
    RegistryClient,
    RegistryUnreachable,
    Unauthorized,
)
from tests.unit.registry.fake import FakeRegistry

CONFIG = {"Entrypoint": ["/bin/sh", "/entry.sh"], "Cmd": ["hello"], "WorkingDir": "/w", "User": "7"}


def keychain(host: str, user: str = "alice", pw: str = "s3cret") -> Keychain:
    auth = base64.b64encode(f"{user}:{pw}".encode()).decode()
    return Keychain.from_docker_config({"auths": {host: {"auth": auth}}}, source="test")


async def test_anonymous_single_manifest() -> None:
    async with FakeRegistry() as reg, RegistryClient() as rc:
        d = reg.add_image("app", "1", CONFIG, media_type=DOCKER_MANIFEST)
        got = await rc.image_config(f"{reg.host}/app:1")
        assert got.digest == got.manifest_digest == d
        c = got.config
        assert (c.entrypoint, c.cmd, c.working_dir) == (("/bin/sh", "/entry.sh"), ("hello",), "/w")
        assert await rc.resolve_digest(f"{reg.host}/app:1") == d
        # a pinned reference needs no request
        before = rc.requests
        assert await rc.resolve_digest(f"{reg.host}/app@{d}") == d and rc.requests == before


async def test_multi_arch_index_resolves_linux_amd64() -> None:
    async with FakeRegistry() as reg, RegistryClient() as rc:
        arm = reg.add_image("app", "", {"Cmd": ["arm"]}, arch="arm64")
        amd = reg.add_image("app", "", {"Cmd": ["amd"]})
        idx = reg.add_index(
            "app",
            "multi",
            [
                (arm, {"os": "linux", "architecture": "arm64"}),
                (amd, {"os": "linux", "architecture": "amd64"}),
            ],
        )
        got = await rc.image_config(f"{reg.host}/app:multi")
        assert got.digest == idx and got.manifest_digest == amd and got.config.cmd == ("amd",)
        assert await rc.resolve_digest(f"{reg.host}/app:multi") == idx
        only_arm = reg.add_index(
            "app", "armonly", [(arm, {"os": "linux", "architecture": "arm64"})]
        )
        with pytest.raises(NoMatchingPlatform, match="has: linux/arm64"):
            await rc.image_config(f"{reg.host}/app@{only_arm}")


async def test_resolve_digest_without_the_header_hashes_the_manifest() -> None:
    async with FakeRegistry(head_digest=False) as reg, RegistryClient() as rc:
        d = reg.add_image("app", "1", CONFIG)
        assert await rc.resolve_digest(f"{reg.host}/app:1") == d


async def test_basic_auth_after_a_basic_challenge() -> None:
    async with FakeRegistry(auth="basic") as reg, RegistryClient() as rc:
        reg.add_image("app", "1", CONFIG)
        with pytest.raises(Unauthorized, match="requires credentials for app and none match"):
            await rc.image_config(f"{reg.host}/app:1")
        got = await rc.image_config(f"{reg.host}/app:1", keychain=keychain(reg.host))
        assert got.config.cmd == ("hello",)
        with pytest.raises(Unauthorized, match="refused the credentials from test"):
            await rc.image_config(f"{reg.host}/app:1", keychain=keychain(reg.host, pw="wrong"))


async def test_bearer_token_challenge_and_token_reuse() -> None:
    async with FakeRegistry(auth="bearer") as reg, RegistryClient() as rc:
        reg.add_image("app", "1", CONFIG)
        chain = keychain(reg.host)
        await rc.image_config(f"{reg.host}/app:1", keychain=chain)
        assert reg.hits["token"] == 1
        # manifest + blob again: the cached token is sent up front, no new challenge
        await rc.image_config(f"{reg.host}/app:1", keychain=chain)
        assert reg.hits["token"] == 1 and reg.hits["manifest-GET"] == 3  # 401 + 2 OK
        with pytest.raises(Unauthorized):
            await rc.image_config(f"{reg.host}/app:1", keychain=keychain(reg.host, pw="no"))


async def test_token_expiry_follows_the_injected_clock() -> None:
    now = [0.0]
    async with FakeRegistry(auth="bearer") as reg, RegistryClient(clock=lambda: now[0]) as rc:
        reg.add_image("app", "1", CONFIG)
        chain = keychain(reg.host)
        await rc.resolve_digest(f"{reg.host}/app:1", keychain=chain)
        now[0] = 300 - 5 - 0.001  # expires_in 300 minus the 5 s margin: still valid
        await rc.resolve_digest(f"{reg.host}/app:1", keychain=chain)
        assert reg.hits["token"] == 1
        now[0] = 300 - 5
        await rc.resolve_digest(f"{reg.host}/app:1", keychain=chain)
        assert reg.hits["token"] == 2


async def test_not_found_unreachable_slow_and_tampered() -> None:
    async with FakeRegistry() as reg, RegistryClient(request_timeout_s=0.3) as rc:
        with pytest.raises(ImageNotFound, match="no such image"):
            await rc.image_config(f"{reg.host}/missing:1")
        with pytest.raises(RegistryUnreachable, match="unreachable") as e:
            await rc.resolve_digest(f"127.0.0.1:{free_port()}/app:1")
        assert e.value.retryable
        d = reg.add_image("app", "1", CONFIG)
        # a registry serving other bytes under a digest is caught
        media, body = reg.manifests[("app", d)]
        reg.manifests[("app", d)] = (media, body.replace(b'"layers"', b'"layerz"'))
        with pytest.raises(BadManifest, match="digest mismatch"):
            await rc.image_config(f"{reg.host}/app@{d}")
        reg.delay_s = 1.0
        with pytest.raises(RegistryUnreachable, match=r"did not answer within 0\.3s"):
            await rc.image_config(f"{reg.host}/app:1")


async def test_a_config_over_the_caps_is_refused_naming_the_image() -> None:
    async with FakeRegistry() as reg, RegistryClient() as rc:
        # 150,000 words of 9 bytes ('"w000000", '): ~1.35 MB, over the 1 MiB config cap
        # (was 8 MiB); the manifest says so, and nothing is downloaded
        d = reg.add_image("big", "1", {"Cmd": [f"w{i:06d}" for i in range(150_000)]})
        before = reg.hits.get("blob", 0)
        with pytest.raises(
            ConfigTooLarge, match=r"/big:1: the image config is \d+ bytes, over the 1048576"
        ):
            await rc.image_config(f"{reg.host}/big:1")
        assert reg.hits.get("blob", 0) == before
        # a manifest that understates the size: the download stops at the cap
        media, body = reg.manifests[("big", d)]
        doc = json.loads(body)
        doc["config"]["size"] = 100
        reg.put_manifest("big", "2", media, doc)
        with pytest.raises(BadManifest, match=r"over the 1048576-byte cap"):
            await rc.image_config(f"{reg.host}/big:2")
        # under the byte cap, over the word cap: refused once parsed, the image named
        reg.add_image("long", "1", {"Cmd": ["w"] * 300})
        with pytest.raises(ConfigTooLarge, match=r"/long:1: the image config's Cmd has 300 words"):
            await rc.image_config(f"{reg.host}/long:1")
