"""A guarded registry client (the webhook's) against registries on loopback.

Loopback is exactly what the guard refuses, so each test lists the fake
registries it means to reach (as an admin lists a registry endpoint) and
shows that what is not listed is never connected to."""

from __future__ import annotations

import base64

import pytest

from sandman.netguard import AddressRule, RefusedAddress
from sandman.registry import (
    BadManifest,
    InvalidReference,
    Keychain,
    RegistryClient,
    RegistryUnreachable,
)
from tests.unit.registry.fake import FakeRegistry

CONFIG = {"Entrypoint": ["/e"], "Cmd": ["c"]}


def listed(*regs: FakeRegistry) -> AddressRule:
    hosts = set()
    for r in regs:
        host, _, port = r.host.rpartition(":")
        hosts.add((host, int(port)))
    return AddressRule(listed=frozenset(hosts))


async def test_loopback_is_refused_unless_listed_by_literal_and_by_name() -> None:
    async with FakeRegistry() as reg:
        reg.add_image("app", "1", CONFIG)
        port = reg.host.rpartition(":")[2]
        async with RegistryClient(guard=AddressRule()) as rc:
            with pytest.raises(RefusedAddress, match=r"refused address \(loopback\)"):
                await rc.image_config(f"{reg.host}/app:1")
            # a name that resolves to loopback (what DNS rebinding makes of a
            # public name) is refused on the address it would connect to
            with pytest.raises(RefusedAddress, match=r"resolves only to refused addresses"):
                await rc.image_config(f"localhost:{port}/app:1")
        assert reg.hits == {}  # not one request reached it
        async with RegistryClient(guard=listed(reg)) as rc:
            got = await rc.image_config(f"{reg.host}/app:1")
            assert got.config.entrypoint == ("/e",)


async def test_an_endpoint_mapping_reaches_its_target_only() -> None:
    async with FakeRegistry() as reg:
        reg.add_image("app", "1", CONFIG)
        target = f"http://{reg.host}"
        # the image names registry.test:5000; the admin maps it to the fake
        async with RegistryClient(
            guard=listed(reg), endpoints={"registry.test:5000": target}
        ) as rc:
            got = await rc.image_config("registry.test:5000/app:1")
            assert got.config.cmd == ("c",)


async def test_only_blob_redirects_are_followed_and_only_to_allowed_addresses() -> None:
    async with FakeRegistry() as reg, FakeRegistry() as storage, FakeRegistry() as other:
        reg.add_image("app", "1", CONFIG)
        storage.blobs.update(reg.blobs)
        reg.blob_redirect = f"http://{storage.host}"
        # the storage host is allowed (listed here): the blob comes from there
        async with RegistryClient(guard=listed(reg, storage)) as rc:
            got = await rc.image_config(f"{reg.host}/app:1")
            assert got.config.cmd == ("c",) and storage.hits["blob"] == 1
        # storage at a refused address: the redirect's connection is refused
        async with RegistryClient(guard=listed(reg)) as rc:
            with pytest.raises(RefusedAddress, match="loopback"):
                await rc.image_config(f"{reg.host}/app:1")
        assert storage.hits["blob"] == 1
        # a manifest redirect is never followed, wherever it points
        reg.manifest_redirect = f"http://{other.host}"
        other.add_image("app", "1", CONFIG)
        async with RegistryClient(guard=listed(reg, other)) as rc:
            with pytest.raises(RefusedAddress, match="redirect outside a blob download"):
                await rc.image_config(f"{reg.host}/app:1")
        assert other.hits == {}
        # a redirect loop ends after 3 hops
        reg.manifest_redirect = ""
        reg.blob_redirect = f"http://{reg.host}"
        async with RegistryClient(guard=listed(reg)) as rc:
            with pytest.raises(RefusedAddress, match="more than 3 redirects"):
                await rc.image_config(f"{reg.host}/app:1")


async def test_the_token_realm_must_be_the_registrys_own_host() -> None:
    auth = base64.b64encode(b"alice:s3cret").decode()
    async with FakeRegistry(auth="bearer") as reg, FakeRegistry() as elsewhere:
        reg.add_image("app", "1", CONFIG)
        chain = Keychain.from_docker_config({"auths": {reg.host: {"auth": auth}}})
        reg.realm = f"http://{elsewhere.host}/token"
        async with RegistryClient(guard=listed(reg, elsewhere)) as rc:
            with pytest.raises(RefusedAddress, match="token realm is on another host"):
                await rc.image_config(f"{reg.host}/app:1", keychain=chain)
        assert elsewhere.hits == {}  # the credentials never went there
        reg.realm = ""
        async with RegistryClient(guard=listed(reg)) as rc:
            got = await rc.image_config(f"{reg.host}/app:1", keychain=chain)
            assert got.config.cmd == ("c",) and reg.tokens_issued == 1


async def test_deeply_nested_json_is_a_bad_manifest_not_a_recursion_error() -> None:
    deep = b"[" * 200_000 + b"]" * 200_000  # 400 KB, under every cap
    async with (
        FakeRegistry(manifest_answer=(200, deep)) as reg,
        RegistryClient(guard=listed(reg)) as rc,
    ):
        with pytest.raises(BadManifest, match="not JSON"):
            await rc.image_config(f"{reg.host}/app:1")
    async with FakeRegistry(auth="bearer", token_answer=deep) as reg:
        reg.add_image("app", "1", CONFIG)
        async with RegistryClient(guard=listed(reg)) as rc:
            with pytest.raises(BadManifest, match="not a token response"):
                await rc.image_config(f"{reg.host}/app:1")


@pytest.mark.parametrize("host", ["127.1", "2130706433", "0x7f000001", "[::ffff:127.0.0.1]"])
async def test_other_spellings_of_loopback_never_connect(host: str) -> None:
    async with FakeRegistry() as reg, RegistryClient(guard=AddressRule()) as rc:
        port = reg.host.rpartition(":")[2]
        with pytest.raises((RefusedAddress, InvalidReference, RegistryUnreachable)):
            await rc.image_config(f"{host}:{port}/app:1")
        assert reg.hits == {}
