"""The webhook's image-config cache (injected clock) and lookups against a loopback registry."""

from __future__ import annotations

import argparse
import asyncio
import base64

import pytest

from sandman.contract import ANN_INJECTED, LABEL_SANDBOX
from sandman.harness.testing import free_port
from sandman.oci import ImageConfig, Reference
from sandman.registry import Keychain, RegistryClient
from sandman.webhook.config import WebhookConfig, add_flags, from_args
from sandman.webhook.imagecache import ImageConfigCache
from sandman.webhook.imageconfig import ImageConfigResolver, pull_secret_names
from sandman.webhook.lookups import AdmissionLookups, address_rule
from sandman.webhook.policy import RuleSet, parse_policy
from sandman.webhook.review import Review, parse_review
from tests.unit.registry.fake import FakeRegistry, Tarpit

CFG = ImageConfig(entrypoint=("/e",), cmd=("c",))
D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_tag_entries_expire_digest_entries_do_not() -> None:
    clock = Clock()
    cache = ImageConfigCache(clock, tag_ttl_s=30, failure_ttl_s=5)
    tag = Reference.parse("127.0.0.1:5000/app:1")
    cache.remember(tag, "anonymous", D1, CFG)
    clock.t += 30 - 0.001  # just inside the tag TTL: answered from the cache
    assert cache.get(tag, "anonymous") is not None
    clock.t += 0.001  # at 30 s the tag must be resolved again ...
    assert cache.get(tag, "anonymous") is None
    assert cache.stale_digest(tag, "anonymous") == D1  # ... by one HEAD, not a full fetch
    clock.t += 10**6  # content named by digest never changes
    assert cache.get(tag.with_digest(D1), "anonymous") is not None
    assert cache.config_for(tag, D1, "anonymous") == CFG


def test_failures_expire_and_entries_are_per_login() -> None:
    clock = Clock()
    cache = ImageConfigCache(clock, tag_ttl_s=30, failure_ttl_s=5)
    ref = Reference.parse("127.0.0.1:5000/app:1")
    cache.remember_failure(ref, "anonymous", "unreachable", True)
    clock.t += 4.999
    assert cache.failure(ref, "anonymous") == ("unreachable", True)
    clock.t += 0.001
    assert cache.failure(ref, "anonymous") is None
    cache.remember(ref, "cred-a", D1, CFG)
    assert cache.get(ref, "cred-a") is not None
    assert cache.get(ref, "anonymous") is None  # never answered to a pod without that login


def test_lru_bound() -> None:
    cache = ImageConfigCache(Clock(), max_entries=2)
    refs = [Reference.parse(f"r.io/app{i}@{D1}") for i in range(3)]
    for r in refs:
        cache.remember(r, "anonymous", D1, CFG)
    assert cache.get(refs[0], "anonymous") is None and len(cache) == 2


def test_pull_secret_names() -> None:
    pod = {"spec": {"imagePullSecrets": [{"name": "a"}, {}, {"name": "b"}]}}
    assert pull_secret_names(pod) == ["a", "b"] and pull_secret_names({}) == []


async def test_one_fetch_per_image_for_a_burst_then_the_cache() -> None:
    async with FakeRegistry() as reg:
        d = reg.add_image("app", "1", {"Entrypoint": ["/e"], "Cmd": ["c"]})
        clock = Clock()
        res = ImageConfigResolver(RegistryClient(), ImageConfigCache(clock))
        image = f"{reg.host}/app:1"
        got = await asyncio.gather(*(res.lookup(image, "ns", []) for _ in range(20)))
        assert {(f.digest, f.config.entrypoint if f.config else None) for f in got} == {
            (d, ("/e",))
        }
        assert reg.hits["manifest-GET"] == 1 and reg.hits["blob"] == 1
        await res.lookup(image, "ns", [])
        assert reg.hits["manifest-GET"] == 1  # within the tag TTL: no request
        clock.t += 30
        again = await res.lookup(image, "ns", [])
        # after the TTL, one HEAD confirms the tag did not move
        assert again.digest == d and reg.hits["manifest-HEAD"] == 1
        assert reg.hits["manifest-GET"] == 1
        await res.close()


async def test_a_slow_registry_fails_the_budget_but_fills_the_cache_for_the_retry() -> None:
    async with FakeRegistry(delay_s=0.5) as reg:
        reg.add_image("app", "1", {"Cmd": ["c"]})
        res = ImageConfigResolver(RegistryClient(), ImageConfigCache(Clock()), budget_s=0.1)
        image = f"{reg.host}/app:1"
        first = await res.lookup(image, "ns", [])
        assert first.config is None and "within 0.1s" in first.error
        # the fetch went on in the background; the retry is answered from the cache
        async with asyncio.timeout(10):
            while not res.cache.get(Reference.parse(image), "anonymous"):
                await asyncio.sleep(0.05)
        retry = await res.lookup(image, "ns", [])
        assert retry.config is not None and retry.config.cmd == ("c",)
        await res.close()


async def test_unreachable_and_missing_images_are_errors_remembered_briefly() -> None:
    async with FakeRegistry() as reg:
        clock = Clock()
        res = ImageConfigResolver(RegistryClient(), ImageConfigCache(clock, failure_ttl_s=5))
        missing = await res.lookup(f"{reg.host}/nope:1", "ns", [])
        assert missing.error == f"image config lookup failed for {reg.host}: not found"
        await res.lookup(f"{reg.host}/nope:1", "ns", [])
        assert reg.hits["manifest-GET"] == 1  # the retry within 5 s is answered at once
        bad = await res.lookup("Not A Ref", "ns", [])
        assert bad.error and bad.config is None
        await res.close()


async def test_credentials_decide_the_cache_entry() -> None:
    class Secrets:
        def __init__(self, chain: Keychain) -> None:
            self.chain = chain

        async def keychain(self, namespace: str, names: list[str]) -> Keychain:
            return self.chain if names else Keychain()

    async with FakeRegistry(auth="basic") as reg:
        reg.add_image("app", "1", {"Cmd": ["private"]})
        auth = base64.b64encode(b"alice:s3cret").decode()
        chain = Keychain.from_docker_config({"auths": {reg.host: {"auth": auth}}})
        res = ImageConfigResolver(
            RegistryClient(),
            ImageConfigCache(Clock()),
            secrets=Secrets(chain),  # type: ignore[arg-type]
        )
        image = f"{reg.host}/app:1"
        ok = await res.lookup(image, "ns", ["regcred"])
        assert ok.config is not None and ok.config.cmd == ("private",)
        # a pod without the secret is not answered from the entry the secret filled
        denied = await res.lookup(image, "other", [])
        assert denied.config is None and ": unauthorized" in denied.error
        await res.close()


async def test_a_registry_down_after_the_ttl_falls_back_to_the_last_config_with_a_note() -> None:
    clock = Clock()
    reg = FakeRegistry()
    async with reg:
        d = reg.add_image("app", "1", {"Cmd": ["c"]})
        reg.add_image("gone", "1", {"Cmd": ["g"]})
        res = ImageConfigResolver(RegistryClient(), ImageConfigCache(clock), budget_s=2)
        await res.lookup(f"{reg.host}/app:1", "ns", [])
        await res.lookup(f"{reg.host}/gone:1", "ns", [])
        host = reg.host
        # the tag "gone" is deleted: a definitive answer is never papered over
        del reg.manifests[("gone", "1")]
        clock.t += 30
        gone = await res.lookup(f"{host}/gone:1", "ns", [])
        assert gone.config is None and gone.error.endswith(": not found")
    # the registry is down now: nodes that cached the image still run it, so
    # the last config the tag named is used, and the note says so
    down = await res.lookup(f"{host}/app:1", "ns", [])
    assert down.config is not None and down.config.cmd == ("c",) and down.digest == d
    assert "registry failed" in down.note and d in down.note
    # the failure is remembered for 5 s: the next admission is answered at once, the same way
    again = await res.lookup(f"{host}/app:1", "ns", [])
    assert again.config == down.config and again.note
    await res.close()


def _sandbox_review(image: str, *, annotations: dict[str, str] | None = None) -> Review:
    pod = {
        "metadata": {"labels": {LABEL_SANDBOX: "true"}, "annotations": annotations or {}},
        "spec": {"containers": [{"name": "main", "image": image}]},
    }
    return parse_review(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u",
                "kind": {"kind": "Pod"},
                "operation": "CREATE",
                "namespace": "team",
                "object": pod,
            },
        }
    )


def _rule(mode: str, registries: list[str]) -> RuleSet:
    doc = {
        "apiVersion": "sandman.dev/v1alpha1",
        "kind": "SandboxPolicy",
        "rules": [{"name": "r", "mode": mode, "allowedRegistries": registries}],
    }
    return parse_policy(doc).select({})


async def test_lookups_only_of_registries_the_rule_names_in_every_mode() -> None:
    """The image's host is the pod author's choice: the webhook asks only hosts
    the governing rule names with the host spelled out. ``*`` and host globs let
    pods pull; they never make the webhook connect, in enforce, warn or audit."""
    async with FakeRegistry() as reg:
        reg.add_image("app", "1", {"Cmd": ["c"]})
        res = ImageConfigResolver(RegistryClient(), ImageConfigCache(Clock()))
        lookups = AdmissionLookups(res, None)
        image = f"{reg.host}/app:1"
        r = _sandbox_review(image)
        # enforce refuses the registry: the registry rule denies, nothing is asked
        assert await lookups.images_for(r, _rule("enforce", ["registry.example/*"])) == {}
        for mode in ("enforce", "warn", "audit"):
            for patterns in (["*"], ["127.0.0.*/*"], ["registry.example/*"]):
                if mode == "enforce" and patterns == ["registry.example/*"]:
                    continue
                # (the policy parser refuses host globs; a RuleSet may still hold one)
                rule = RuleSet(name="r", mode=mode, allowed_registries=tuple(patterns))
                got = await lookups.images_for(r, rule)
                assert got is not None and got[image].config is None, (mode, patterns)
                assert got[image].error.startswith(f"image config lookup skipped for {reg.host}")
                assert "name it there, or set `command`" in got[image].error
        assert reg.hits.get("manifest-GET", 0) == 0  # not one connection
        for mode in ("enforce", "warn", "audit"):
            named = await lookups.images_for(r, _rule(mode, [f"{reg.host}/*"]))
            assert named is not None and named[image].config is not None
        await lookups.close()


async def test_a_copied_sandbox_without_a_command_is_looked_up_as_it_will_run() -> None:
    """A pod that arrives injected (copied from a sandbox) is stripped and injected
    anew; its original command was the image's, so the image is looked up."""
    async with FakeRegistry() as reg:
        reg.add_image("app", "1", {"Cmd": ["c"]})
        image = f"{reg.host}/app:1"
        lookups = AdmissionLookups(
            ImageConfigResolver(RegistryClient(), ImageConfigCache(Clock())), None
        )
        r = _sandbox_review(image, annotations={ANN_INJECTED: "0.1"})
        got = await lookups.images_for(r, _rule("enforce", [f"{reg.host}/*"]))
        assert got is not None and got[image].config is not None
        await lookups.close()


async def test_a_pod_author_never_reads_a_registry_answer_back() -> None:
    """A lookup must not be a way to read a host: what reaches the pod (warning,
    denial, Event) is a fixed reason, never a body or a socket error."""
    secret = b'{"AccessKeyId": "ASIA-SECRET", "instance-id": "i-0123"}'
    async with FakeRegistry(manifest_answer=(400, secret)) as reg:
        res = ImageConfigResolver(RegistryClient(), ImageConfigCache(Clock()))
        got = await res.lookup(f"{reg.host}/app:1", "ns", [])
        assert got.error == f"image config lookup failed for {reg.host}: bad response"
        reg.manifest_answer = (503, secret)
        other = await res.lookup(f"{reg.host}/app:2", "ns", [])
        assert other.error == f"image config lookup failed for {reg.host}: unreachable"
        await res.close()
    closed = f"127.0.0.1:{free_port()}"  # nobody listens: a port scan's "closed"
    res = ImageConfigResolver(RegistryClient(), ImageConfigCache(Clock()))
    refused = await res.lookup(f"{closed}/app:1", "ns", [])
    assert refused.error == f"image config lookup failed for {closed}: unreachable"
    await res.close()


async def test_a_tarpit_registry_in_one_namespace_does_not_starve_another() -> None:
    """120 unique tags on a registry that accepts and never answers, from
    namespace A, used to take all 100 pooled connections for 10 s each; an
    uncached lookup in namespace B then waited for a connection past its
    budget. Now A holds at most 8 (the per-host bound) and B is answered."""
    async with Tarpit(want=8) as tarpit, FakeRegistry() as reg:
        reg.add_image("app", "1", {"Cmd": ["b"]})
        res = ImageConfigResolver(RegistryClient(), ImageConfigCache(Clock()), budget_s=1.0)
        flood = [
            asyncio.ensure_future(res.lookup(f"{tarpit.host}/t:{i}", "team-a", []))
            for i in range(120)
        ]
        async with asyncio.timeout(5):
            await tarpit.enough.wait()  # A's lookups hold the tarpit's connections now
        b = await res.lookup(f"{reg.host}/app:1", "team-b", [])
        assert b.error == "" and b.config is not None and b.config.cmd == ("b",)
        got = await asyncio.gather(*flood)
        busy = [f for f in got if "busy (8 lookups already running for this registry)" in f.error]
        timed_out = [f for f in got if ": timed out" in f.error]
        assert len(timed_out) == 8 and len(busy) == 112, {f.error for f in got}
        await res.close()


async def test_a_host_that_timed_out_rests_and_a_late_fetch_is_bounded() -> None:
    async with Tarpit(want=1) as tarpit:
        clock = Clock()
        res = ImageConfigResolver(
            RegistryClient(), ImageConfigCache(clock), budget_s=0.2, grace_s=0.3, host_rest_s=5
        )
        first = await res.lookup(f"{tarpit.host}/t:1", "ns", [])
        assert first.error.endswith("timed out (no answer within 0.2s)")
        # the fetch goes on for the retry, but only 0.3 s more: then the slot is free
        async with asyncio.timeout(2):
            while res.inflight.counts.total:
                await asyncio.sleep(0.05)
        # the host rests: another tag there fails at once, without a connection
        before = tarpit.accepted
        second = await res.lookup(f"{tarpit.host}/t:2", "ns", [])
        assert "timed out (a moment ago; not asked again yet)" in second.error
        assert tarpit.accepted == before
        clock.t += 5  # rested: asked again
        third = asyncio.ensure_future(res.lookup(f"{tarpit.host}/t:3", "ns", []))
        async with asyncio.timeout(2):
            while tarpit.accepted == before:
                await asyncio.sleep(0.02)
        await third
        await res.close()


def test_the_webhooks_address_rule_comes_from_its_flags() -> None:
    config = WebhookConfig(
        registry_endpoints=(("127.0.0.1:5000", "http://10.244.0.1:5000"),),
        lookup_allow_addresses=("registry.internal:5000",),
        cluster_cidrs=("10.96.0.0/12",),
        registry_token_hosts=(("gitlab.example:5050", "gitlab.example"),),
    )
    rule = address_rule(config)
    # the local harness's endpoint is reached; the same node's kubelet port is not
    assert rule.refusal("10.244.0.1", 5000, "10.244.0.1") is None
    assert rule.refusal("10.244.0.1", 10250, "10.244.0.1") == "private"
    assert rule.refusal("registry.internal", 5000, "10.1.2.3") is None
    assert rule.refusal("kubernetes.default", 443, "10.96.0.1") == "cluster network"
    assert rule.token_hosts["gitlab.example:5050"] == ("gitlab.example",)
    assert rule.token_hosts["registry-1.docker.io"] == ("auth.docker.io",)


def test_lookup_flags_parse_and_bad_ones_say_what_is_expected(
    capsys: pytest.CaptureFixture[str],
) -> None:
    p = argparse.ArgumentParser()
    add_flags(p)
    args = p.parse_args(
        [
            "--daemon-image=d",
            "--lookup-allow-address=registry.internal:5000",
            "--cluster-cidr=10.96.0.1/12",  # normalised to its network
            "--registry-token-host=gitlab.example:5050=gitlab.example",
        ]
    )
    config = from_args(args)
    assert config.lookup_allow_addresses == ("registry.internal:5000",)
    assert config.cluster_cidrs == ("10.96.0.0/12",)
    assert config.registry_token_hosts == (("gitlab.example:5050", "gitlab.example"),)
    for bad, says in (
        ("--lookup-allow-address=registry.internal", "expected HOST:PORT"),
        ("--cluster-cidr=ten", "expected a CIDR"),
        ("--registry-token-host=Not A Host=x", "is no registry host"),
    ):
        with pytest.raises(SystemExit):
            p.parse_args(["--daemon-image=d", bad])
        assert says in capsys.readouterr().err
