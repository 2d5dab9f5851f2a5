"""The webhook's own TLS against a real apiserver: Secret, replicas, caBundles, CA rotation."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography import x509

from sandman import tls
from sandman.harness.cluster.local import LocalCluster
from sandman.kube_async import (
    MERGE_PATCH,
    MUTATING_WEBHOOKS,
    SECRETS,
    VALIDATING_WEBHOOKS,
    ApiError,
    KubeClient,
    Resource,
)
from sandman.webhook.cert_plan import Cert, parse_bundle
from sandman.webhook.certs import CABUNDLE_SETTLE, CertManager

SECRET = "sandman-webhook-tls"
DNS = ("sandman-webhook.test.svc", "localhost")


@pytest.fixture
async def kube(cluster: LocalCluster) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(cluster.kubeconfig) as client:
        yield client


class Clock:
    """Wall time plus an offset the test moves forward (certificates stay real)."""

    def __init__(self) -> None:
        self.offset = dt.timedelta()

    def __call__(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) + self.offset


def replica(
    client: KubeClient,
    namespace: str,
    work_dir: Path,
    configs: tuple[tuple[Resource, str], ...] = (),
    clock: Clock | None = None,
) -> CertManager:
    return CertManager(
        client,
        namespace=namespace,
        secret_name=SECRET,
        dns_names=DNS,
        ip_addresses=("127.0.0.1",),
        webhook_configs=configs,
        ca_validity=dt.timedelta(days=365),
        cert_validity=dt.timedelta(days=90),
        work_dir=work_dir,
        clock=clock or Clock(),
    )


class StaleFirstRead(KubeClient):
    """A replica whose first read of the Secret happened before another replica created it."""

    stale = True

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> Any:
        if res == SECRETS and self.stale:
            self.stale = False
            raise ApiError(404, {"reason": "NotFound", "message": "stale read"})
        return await super().get(res, name, namespace)


class RacedWrite(KubeClient):
    """Another writer touches the Secret between our read and our first replace."""

    raced = False

    async def replace(
        self, res: Resource, name: str, obj: Any, namespace: str | None = None
    ) -> Any:
        if res == SECRETS and not self.raced:
            self.raced = True
            bump = {"metadata": {"labels": {"touched": "yes"}}}
            await self.patch(res, name, bump, namespace, content_type=MERGE_PATCH)
        return await super().replace(res, name, obj, namespace)


async def secret_certs(kube: KubeClient, namespace: str) -> dict[str, bytes]:
    secret = await kube.get(SECRETS, SECRET, namespace)
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


async def test_replicas_converge_on_one_secret(
    cluster: LocalCluster, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    a, b = replica(kube, namespace, tmp_path / "a"), replica(kube, namespace, tmp_path / "b")
    await asyncio.gather(a.reconcile(), b.reconcile())
    data = await secret_certs(kube, namespace)
    assert set(data) == {"ca.crt", "ca.key", "tls.crt", "tls.key", "ca-bundle.crt"}
    ca, serving = Cert.parse(data["ca.crt"]), Cert.parse(data["tls.crt"])
    assert serving.issued_by(ca)
    assert serving.sans == {*DNS, "127.0.0.1"}
    assert a.ca_bundle_pem == b.ca_bundle_pem == data["ca-bundle.crt"] == data["ca.crt"]
    assert a.ready.is_set() and b.ready.is_set()
    assert a.not_after == b.not_after == serving.not_after
    # A third replica loses the create race outright (409) and adopts the Secret.
    async with StaleFirstRead(kube.creds) as stale:
        c = replica(stale, namespace, tmp_path / "c")
        await c.reconcile()
        assert not stale.stale
    assert c.ca_bundle_pem == a.ca_bundle_pem and c.not_after == a.not_after
    assert await secret_certs(kube, namespace) == data


def webhook_config(name: str, namespace: str, other_ca: bytes) -> dict[str, Any]:
    def webhook(short: str, ca_bundle: bytes | None) -> dict[str, Any]:
        client_config: dict[str, Any] = {"url": "https://127.0.0.1:1/x"}
        if ca_bundle is not None:
            client_config["caBundle"] = base64.b64encode(ca_bundle).decode()
        return {
            "name": f"{short}.certs.sandman.dev",
            "clientConfig": client_config,
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                }
            ],
            # Never called: only this test's namespace, and a label no object has.
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "objectSelector": {
                "matchExpressions": [{"key": "sandman.dev/never-matches", "operator": "Exists"}]
            },
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
        }

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        # One webhook without a caBundle (add) and one with a stranger's (replace).
        "webhooks": [webhook("a", None), webhook("b", other_ca)],
    }


async def served_cert(ctx: ssl.SSLContext, trust: bytes) -> Cert:
    """Serve ``ctx``, connect as a client that trusts only ``trust``, return the served cert."""
    runner = web.AppRunner(web.Application())
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        port = runner.addresses[0][1]
        client = ssl.create_default_context(cadata=trust.decode())
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname="127.0.0.1"
        )
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        await writer.wait_closed()
        return Cert.from_x509(x509.load_der_x509_certificate(der))
    finally:
        await runner.cleanup()


async def test_cabundle_sync_and_ca_rotation_ordering(
    cluster: LocalCluster, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    stranger = tls.new_ca("stranger", now=Clock()(), valid_for=dt.timedelta(days=1))
    name = f"certs-{namespace}"
    await kube.create(MUTATING_WEBHOOKS, webhook_config(name, namespace, stranger.cert_pem))
    # The validating configuration does not exist: logged, not fatal.
    configs = ((MUTATING_WEBHOOKS, name), (VALIDATING_WEBHOOKS, f"missing-{namespace}"))
    try:
        clock = Clock()
        a = replica(kube, namespace, tmp_path / "a", configs, clock)
        b = replica(kube, namespace, tmp_path / "b", configs, clock)
        await a.reconcile()
        await b.reconcile()

        async def bundles() -> list[bytes]:
            cfg = await kube.get(MUTATING_WEBHOOKS, name)
            return [base64.b64decode(w["clientConfig"]["caBundle"]) for w in cfg["webhooks"]]

        before = await secret_certs(kube, namespace)
        old_ca = Cert.parse(before["ca.crt"])
        assert await bundles() == [before["ca-bundle.crt"]] * 2
        assert (await served_cert(a.ssl_context(), a.ca_bundle_pem)).issued_by(old_ca)

        # Pass 1 of a rotation: new CA, both CAs trusted everywhere, serving cert unmoved.
        await a.rotate_ca_now()
        mid = await secret_certs(kube, namespace)
        new_ca = Cert.parse(mid["ca.crt"])
        assert new_ca.fingerprint != old_ca.fingerprint
        fps = [c.fingerprint for c in parse_bundle(mid["ca-bundle.crt"])]
        assert fps == [new_ca.fingerprint, old_ca.fingerprint]
        assert await bundles() == [mid["ca-bundle.crt"]] * 2
        assert mid["tls.crt"] == before["tls.crt"]
        assert Cert.parse(mid["tls.crt"]).issued_by(old_ca)
        assert a.ca_bundle_pem == mid["ca-bundle.crt"]

        # A pass straight after: the caBundles hold the new CA, but not for long enough
        # for every apiserver to have seen it. Nothing moves.
        await a.reconcile()
        await b.reconcile()
        assert await secret_certs(kube, namespace) == mid
        # Once the caBundles have held it for the settling time, the cert moves.
        clock.offset += CABUNDLE_SETTLE
        await a.reconcile()
        after = await secret_certs(kube, namespace)
        serving = Cert.parse(after["tls.crt"])
        assert serving.issued_by(new_ca)
        assert after["ca-bundle.crt"] == mid["ca-bundle.crt"]  # the old CA stays until it expires
        # An apiserver trusting the bundle verifies what each replica serves, before and after.
        assert (await served_cert(a.ssl_context(), a.ca_bundle_pem)).issued_by(new_ca)
        assert (await served_cert(b.ssl_context(), mid["ca-bundle.crt"])).issued_by(old_ca)
        await b.reconcile()
        assert b.not_after == a.not_after == serving.not_after
        assert (await served_cert(b.ssl_context(), b.ca_bundle_pem)).issued_by(new_ca)
    finally:
        await kube.delete(MUTATING_WEBHOOKS, name)


async def test_a_conflicting_secret_update_writes_nothing_until_the_next_pass(
    cluster: LocalCluster, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    async with RacedWrite(kube.creds) as racing:
        a = replica(racing, namespace, tmp_path / "a")
        await a.reconcile()
        before = await secret_certs(kube, namespace)
        not_after = a.not_after
        # The rotation's write meets a changed resourceVersion (409): nothing lands,
        # and the pass stops before touching caBundles or the served cert.
        await a.rotate_ca_now()
        assert racing.raced
        assert await secret_certs(kube, namespace) == before
        assert a.not_after == not_after and a.ca_bundle_pem == before["ca-bundle.crt"]
        # The next pass re-reads and writes on top of the other writer's change.
        await a.rotate_ca_now()
        secret = await kube.get(SECRETS, SECRET, namespace)
        assert secret["metadata"]["labels"]["touched"] == "yes"
        assert base64.b64decode(secret["data"]["ca.crt"]) != before["ca.crt"]
