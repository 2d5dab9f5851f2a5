"""The webhook's reads beyond the review, against the real apiserver: pull secrets
for image lookups, scheduler Leases for the "no running scheduler" warning (+ Event)."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import time
from typing import Any

from kubernetes.client import CoreV1Api

from sandman.contract import LABEL_SANDBOX, REASON_SCHEDULER_NOT_RUNNING
from sandman.events import EventRecorder
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import raw
from sandman.kube_async import LEASES, KubeClient
from sandman.registry import RegistryClient
from sandman.webhook.config import WebhookConfig
from sandman.webhook.imagecache import ImageConfigCache
from sandman.webhook.imageconfig import ImageConfigResolver, PullSecrets
from sandman.webhook.lookups import AdmissionLookups
from sandman.webhook.metrics import WebhookMetrics
from sandman.webhook.policy import RuleSet
from sandman.webhook.review import Outcome, Review
from sandman.webhook.schedulers import SchedulerLeases
from sandman.webhook.server import WebhookState, _check_scheduler
from tests.unit.registry.fake import FakeRegistry, Tarpit


async def test_pull_secrets_from_the_api_open_a_private_registry(
    cluster: LocalCluster, core: CoreV1Api, namespace: str
) -> None:
    async with (
        FakeRegistry(auth="bearer") as reg,
        KubeClient.from_kubeconfig(cluster.kubeconfig) as kube,
    ):
        reg.add_image("team/app", "1", {"Entrypoint": ["/app"], "Cmd": ["--serve"]})
        auth = base64.b64encode(b"alice:s3cret").decode()
        config = json.dumps({"auths": {reg.host: {"auth": auth}}}).encode()
        core.create_namespaced_secret(
            namespace,
            {
                "metadata": {"name": "regcred"},
                "type": "kubernetes.io/dockerconfigjson",
                "data": {".dockerconfigjson": base64.b64encode(config).decode()},
            },
        )
        res = ImageConfigResolver(
            RegistryClient(),
            ImageConfigCache(time.monotonic),
            secrets=PullSecrets(kube, time.monotonic),
        )
        image = f"{reg.host}/team/app:1"
        try:
            # a missing secret is skipped as the kubelet skips it; the registry then refuses
            anon = await res.lookup(image, namespace, ["missing"])
            assert anon.config is None and anon.error.endswith(
                ": unauthorized (the pod names no imagePullSecret this registry accepts)"
            )
            got = await res.lookup(image, namespace, ["missing", "regcred"])
            assert got.config is not None and got.config.entrypoint == ("/app",), got
            assert reg.tokens_issued == 1  # only the secret's login got a token
        finally:
            await res.close()


def _lease(renewed: dt.datetime) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "t-scheduler"},
        "spec": {
            "holderIdentity": "t-scheduler-0",
            "leaseDurationSeconds": 15,
            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }


async def test_a_sandbox_naming_a_stopped_scheduler_gets_a_warning_and_an_event(
    cluster: LocalCluster, core: CoreV1Api, namespace: str
) -> None:
    now = [0.0]
    pod = {
        "metadata": {"name": "sb", "uid": "u-1", "labels": {LABEL_SANDBOX: "true"}},
        "spec": {"schedulerName": "t-scheduler", "containers": [{"name": "c", "image": "i"}]},
    }
    review = Review("r", "CREATE", namespace, pod, None, False, "Pod")
    async with KubeClient.from_kubeconfig(cluster.kubeconfig) as kube:
        leases = SchedulerLeases(
            kube,
            {"t-scheduler": (namespace, "t-scheduler")},
            clock=lambda: dt.datetime.now(dt.UTC),
            monotonic=lambda: now[0],
        )
        st = WebhookState(config=WebhookConfig(), client=kube, metrics=WebhookMetrics.create())
        st.lookups = AdmissionLookups(None, leases)
        st.recorder = EventRecorder(kube, "sandman-webhook")
        stop = asyncio.Event()
        writer = asyncio.ensure_future(st.recorder.run(stop))

        outcome = Outcome(True)
        await _check_scheduler(st, review, outcome)  # no Lease at all
        assert len(outcome.warnings) == 1 and "no Lease" in outcome.warnings[0]

        # a scheduler that renews its Lease: no warning (once the 5 s cache has passed)
        await kube.create(LEASES, _lease(dt.datetime.now(dt.UTC)), namespace)
        now[0] += 5
        fine = Outcome(True)
        await _check_scheduler(st, review, fine)
        assert fine.warnings == []
        stop.set()
        await writer

    events = raw(core.list_namespaced_event(namespace, _preload_content=False))["items"]
    ours = [e for e in events if e["reason"] == REASON_SCHEDULER_NOT_RUNNING]
    assert len(ours) == 1, events
    assert ours[0]["involvedObject"]["name"] == "sb" and ours[0]["type"] == "Warning"
    assert "'t-scheduler'" in ours[0]["message"]


async def test_lookups_built_from_the_webhooks_flags_keep_namespaces_apart(
    cluster: LocalCluster, core: CoreV1Api, namespace: str
) -> None:
    """The webhook's own lookups (AdmissionLookups.build from its flags, pull
    secrets from the apiserver): a namespace flooding a registry that never
    answers with unique tags does not keep this namespace's private image from
    being read, and a rule that allows every registry ('*') connects nowhere."""
    async with (
        Tarpit() as tarpit,
        FakeRegistry(auth="basic") as reg,
        KubeClient.from_kubeconfig(cluster.kubeconfig) as kube,
    ):
        reg.add_image("team/app", "1", {"Entrypoint": ["/app"]})
        auth = base64.b64encode(b"alice:s3cret").decode()
        config = json.dumps({"auths": {reg.host: {"auth": auth}}}).encode()
        core.create_namespaced_secret(
            namespace,
            {
                "metadata": {"name": "regcred"},
                "type": "kubernetes.io/dockerconfigjson",
                "data": {".dockerconfigjson": base64.b64encode(config).decode()},
            },
        )
        flags = WebhookConfig(
            read_pull_secrets=True,
            image_config_timeout_s=1.0,
            # both are on loopback, which lookups reach only when listed
            lookup_allow_addresses=(reg.host, tarpit.host),
        )
        lookups = AdmissionLookups.build(flags, kube)
        rule = RuleSet(name="r", allowed_registries=(f"{reg.host}/*", f"{tarpit.host}/*"))
        try:
            flood = [
                asyncio.ensure_future(
                    lookups.images_for(_review("team-a", f"{tarpit.host}/t:{i}"), rule)
                )
                for i in range(120)
            ]
            async with asyncio.timeout(5):
                await tarpit.enough.wait()
            image = f"{reg.host}/team/app:1"
            got = await lookups.images_for(_review(namespace, image, secret="regcred"), rule)
            assert got is not None and got[image].config is not None, got
            assert got[image].config.entrypoint == ("/app",)
            flooded = [f for d in await asyncio.gather(*flood) if d for f in d.values()]
            assert sum("busy" in f.error for f in flooded) == 112
            assert tarpit.accepted <= 8  # the per-host bound, not the 100-connection pool

            # a rule that allows every registry names none for lookups: no request
            before = dict(reg.hits)
            everywhere = RuleSet(name="open", mode="warn")
            other = f"{reg.host}/team/app:2"
            skipped = await lookups.images_for(_review(namespace, other), everywhere)
            assert skipped is not None and "lookup skipped" in skipped[other].error
            assert reg.hits == before
        finally:
            await lookups.close()


def _review(namespace: str, image: str, *, secret: str = "") -> Review:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": image}]}
    if secret:
        spec["imagePullSecrets"] = [{"name": secret}]
    pod = {"metadata": {"labels": {LABEL_SANDBOX: "true"}}, "spec": spec}
    return Review("r", "CREATE", namespace, pod, None, False, "Pod")
