"""Hostile image configs against the webhook host process and the real apiserver.

A sandbox without `command` makes the webhook read its image's config from
the registry and cache what it needs. Configs built to be large (millions of
short Cmd words or Env entries, near the old 8 MiB cap) once stayed in the
cache at ~100 MB each, so that a handful OOM-killed a replica and, with
``failurePolicy: Fail``, every sandbox create failed. Here they are refused
with the ``image-config`` rule's message, the webhook's resident memory stays
flat, and admission keeps working.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.contract import LABEL_SANDBOX
from sandman.harness.cluster.deploy import LocalDeployment
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.process import ManagedProcess, wait_healthy
from sandman.oci import ConfigTooLarge
from tests.unit.registry.fake import FakeRegistry

T = TypeVar("T")

OLD_CAP = 8 << 20  # the config byte cap these images were built to pass
HOSTILE = 6  # each near OLD_CAP; ~100 MB kept per image before, 512 Mi a replica's limit
# Growth allowed over the run: the configs are refused before download (their
# manifests state their size) or after parsing at most 1 MiB, and nothing of
# them is cached; 30 MiB is allocator slack, not one image's worth.
RSS_GROWTH_LIMIT_KB = 30 << 10


class RegistryThread:
    """A FakeRegistry on its own event loop and thread: the pod creates below are
    blocking calls, and the webhook's reads must be answered meanwhile."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.registry = FakeRegistry()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def __enter__(self) -> FakeRegistry:
        self.thread.start()
        self.run(self.registry.__aenter__())
        return self.registry

    def __exit__(self, *exc: object) -> None:
        self.run(self.registry.__aexit__(None, None, None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def vm_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def near_old_cap(field: str, nonce: str) -> dict[str, Any]:
    """A config near 8 MiB of short unique strings in ``field`` (Cmd or Env)."""
    # '"<nonce 8><7 digits>", ' is 19 bytes: 8 MiB / 19 = 441,505 words; 440,000
    # leave room for the rest of the document
    words = [f"{nonce}{i:07d}" for i in range(440_000)]
    if field == "Env":
        return {"Env": [f"{w}=1" for w in words[:380_000]], "Cmd": ["/serve"]}
    return {"Cmd": words}


def sandbox(image: str, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "sb-", "labels": {LABEL_SANDBOX: "true"}},
        "spec": on_kwok({"containers": [{"name": "main", "image": image, **container}]}),
    }


def create(core: CoreV1Api, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    resp = core.create_namespaced_pod(namespace, pod, _preload_content=False)
    return dict(json.loads(resp.data))


def denial(core: CoreV1Api, namespace: str, pod: dict[str, Any]) -> str:
    """The apiserver's message for a create that must be denied ('' when admitted)."""
    try:
        create(core, namespace, pod)
    except ApiException as e:
        return str(json.loads(e.body or "{}").get("message", e.body))
    return ""


def workload(pod: dict[str, Any]) -> list[str]:
    """What the daemon starts in the target container (after its ``--``)."""
    command = next(c for c in pod["spec"]["containers"] if c["name"] == "main")["command"]
    return list(command[command.index("--") + 1 :])


@pytest.fixture
def looking_webhook(cluster: LocalCluster) -> Iterator[tuple[LocalDeployment, ManagedProcess]]:
    """The cluster's webhook process restarted with image lookups on (the
    integration tier runs it with lookups off: its kwok pods pull nothing);
    the original comes back afterwards."""
    deployment = cluster.deployment
    if not isinstance(deployment, LocalDeployment):
        pytest.skip("reads the webhook's host process (SANDMAN_TEST_HOST_COMPONENTS=1)")
    yield deployment, next(p for p in deployment.processes() if p.name == "sandman-webhook")


def test_hostile_configs_are_refused_and_memory_stays_flat(
    looking_webhook: tuple[LocalDeployment, ManagedProcess], core: CoreV1Api, namespace: str
) -> None:
    deployment, original = looking_webhook
    nonce = uuid.uuid4().hex[:8]  # a unique digest per image and per run
    with RegistryThread() as reg:
        ok = f"{reg.host}/ok:1"
        reg.add_image("ok", "1", {"Entrypoint": ["/app"], "Cmd": ["--serve"]})
        reg.add_image("warm", "1", {"Cmd": ["w"] * 300})  # over the word cap, tiny
        hostile = []
        for k in range(HOSTILE):
            cfg = near_old_cap("Env" if k % 2 else "Cmd", f"{nonce[:7]}{k}")
            size = len(json.dumps({"architecture": "amd64", "os": "linux", "config": cfg}))
            assert 7 << 20 < size < OLD_CAP, size  # passed the old cap, not the new one
            reg.add_image(f"hostile{k}", "1", cfg)
            hostile.append(f"{reg.host}/hostile{k}:1")
        # under the new 1 MiB cap, over the 256-word cap: parsed, then refused
        for k in range(2):
            reg.add_image(f"many{k}", "1", {"Cmd": [f"{nonce}{k}{i:06d}" for i in range(60_000)]})
            hostile.append(f"{reg.host}/many{k}:1")

        argv = [a for a in original.argv if a != "--image-config-lookup=off"]
        argv.append(f"--lookup-allow-address={reg.host}")  # a loopback registry, listed
        looking = dataclasses.replace(original, argv=tuple(argv))
        policy = deployment.policy
        before = policy.read()
        doc = yaml.safe_load(before)
        for rule in doc["rules"]:
            rule["allowedRegistries"] = [*rule.get("allowedRegistries", []), f"{reg.host}/*"]
        original.stop()
        try:
            looking.start()
            wait_healthy(
                looking,
                deployment.health_checks()[looking.name],
                timeout_s=60,
                progress=lambda _m: None,
            )
            policy.write(yaml.safe_dump(doc))
            pid = looking.running_pid()
            assert pid is not None

            # warm up every path once: a lookup that works, one refused by a cap
            assert workload(create(core, namespace, sandbox(ok))) == ["/app", "--serve"]
            assert "[image-config]" in denial(core, namespace, sandbox(f"{reg.host}/warm:1"))
            rss_before = vm_rss_kb(pid)

            messages = {image: denial(core, namespace, sandbox(image)) for image in hostile}
            rss_after = vm_rss_kb(pid)
            print(
                f"webhook VmRSS: {rss_before} kB before {len(hostile)} hostile configs, "
                f"{rss_after} kB after (+{(rss_after - rss_before) / 1024:.1f} MiB)"
            )

            # (c) admission still works: an ordinary sandbox, and a hostile image
            # with the fix the denial names (an explicit command)
            assert workload(create(core, namespace, sandbox(ok))) == ["/app", "--serve"]
            fixed = create(core, namespace, sandbox(hostile[0], command=["/bin/true"]))
            assert workload(fixed) == ["/bin/true"]
            assert workload(create(core, namespace, sandbox(KWOK_IMAGE, command=["sleep"])))
            policy.write(before)
        finally:
            looking.stop()
            deployment.start_webhook()
            if policy.read() != before:
                policy.write(before)

    # (a) each refused by the image-config rule, with the limits and the fix
    for image, message in messages.items():
        assert "[image-config]" in message and ConfigTooLarge.REASON in message, (image, message)
    # (b) bounded memory: before the fix each image kept ~100 MB
    assert rss_after - rss_before < RSS_GROWTH_LIMIT_KB, (rss_before, rss_after)
