"""A webhook rotating its CA while pods are being created: no failed admission.

A second webhook instance runs in the test process with its own TLS Secret
and its own webhook configuration (failurePolicy Fail, selecting only this
test's pods), so every create below goes through its TLS. The CA is rotated
and the serving cert switched while creates run back to back.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import socket
import threading
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web
from kubernetes.client import AdmissionregistrationV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.contract import ANN_INJECTED, LABEL_SANDBOX
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import api_client
from sandman.harness.probes import insecure_context
from sandman.harness.testing import wait_for
from sandman.kube_async import MUTATING_WEBHOOKS, KubeClient
from sandman.webhook.certs import CABUNDLE_SETTLE, CertManager
from sandman.webhook.config import WebhookConfig
from sandman.webhook.server import create_app


def _served_fingerprint(port: int) -> bytes:
    ctx = insecure_context()
    with socket.create_connection(("127.0.0.1", port)) as s, ctx.wrap_socket(s) as tls:
        return tls.getpeercert(binary_form=True) or b""


async def test_ca_rotation_under_load_fails_no_admission(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    name = f"rot-{uuid.uuid4().hex[:6]}"
    clock_offset = [dt.timedelta(0)]
    config = WebhookConfig(
        host="127.0.0.1",
        port=0,
        namespace=namespace,
        daemon_image=KWOK_IMAGE,
        tls_secret=f"{name}-tls",
        config_name=name,
        extra_ips=("127.0.0.1",),
        work_dir=tmp_path,
        publish_access=False,
    )
    client = KubeClient.from_kubeconfig(cluster.kubeconfig)
    client.open()
    certs = CertManager(
        client,
        namespace=namespace,
        secret_name=config.tls_secret,
        dns_names=config.dns_names,
        ip_addresses=config.extra_ips,
        webhook_configs=((MUTATING_WEBHOOKS, name),),
        ca_validity=dt.timedelta(days=30),
        cert_validity=dt.timedelta(days=7),
        work_dir=tmp_path,
        clock=lambda: dt.datetime.now(dt.UTC) + clock_offset[0],
    )
    await certs.reconcile()
    app = create_app(config, client, certs)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=certs.ssl_context())
    await site.start()
    port = runner.addresses[0][1]
    adm = AdmissionregistrationV1Api(api_client(cluster.kubeconfig))
    core = CoreV1Api(api_client(cluster.kubeconfig))
    adm.create_mutating_webhook_configuration(
        {
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": f"{name}.sandman.dev",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/mutate",
                        "caBundle": base64.b64encode(certs.ca_bundle_pem).decode(),
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                        }
                    ],
                    "objectSelector": {"matchLabels": {"rotation-test": name}},
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 5,
                }
            ],
        }
    )
    stop = threading.Event()
    results: list[str] = []

    def pod(selected_as: str) -> dict[str, Any]:
        return {
            "metadata": {
                "generateName": "rot-",
                "labels": {LABEL_SANDBOX: "true", "rotation-test": selected_as},
            },
            # A command: nothing to look up in a registry (this session may
            # have none; what is tested is the webhook's TLS rotation).
            "spec": on_kwok(
                {"containers": [{"name": "c", "image": KWOK_IMAGE, "command": ["sleep", "1"]}]}
            ),
        }

    def through_our_webhook(selected_as: str) -> bool:
        """A dry-run create comes back mutated by this test's webhook: the
        apiserver's admission chain has the configuration that selects it."""
        made = core.create_namespaced_pod(namespace, pod(selected_as), dry_run="All")
        return ANN_INJECTED in (made.metadata.annotations or {})

    def creator() -> None:
        while not stop.is_set():
            try:
                core.create_namespaced_pod(namespace, pod(name), dry_run="All")
                results.append("ok")
            except ApiException as e:
                results.append(f"{len(results)} {e.status}: {e.body}")

    try:
        # The configuration reaches the apiserver's admission chain by watch.
        await asyncio.to_thread(
            wait_for, lambda: through_our_webhook(name), what="the webhook in the chain"
        )
        thread = threading.Thread(target=creator, daemon=True)
        thread.start()
        before = await asyncio.to_thread(_served_fingerprint, port)
        await asyncio.to_thread(wait_for, lambda: len(results) >= 5, what="creates under way")
        await certs.rotate_ca_now()  # new CA into every caBundle; old cert still served
        assert await asyncio.to_thread(_served_fingerprint, port) == before
        # The apiserver must use the new caBundle before the cert switches
        # (in production: CABUNDLE_SETTLE). Its admission chain applies
        # configuration updates in order, so once a later update of ours
        # (selecting probe pods too) admits a probe pod, it has the new bundle.
        probe = f"{name}-probe"
        selector = {"key": "rotation-test", "operator": "In", "values": [name, probe]}
        adm.patch_mutating_webhook_configuration(
            name,
            [
                {
                    "op": "replace",
                    "path": "/webhooks/0/objectSelector",
                    "value": {"matchExpressions": [selector]},
                }
            ],
        )
        await asyncio.to_thread(
            wait_for, lambda: through_our_webhook(probe), what="the new caBundle in use"
        )
        clock_offset[0] = CABUNDLE_SETTLE + dt.timedelta(seconds=1)
        await certs.reconcile()  # switch the serving cert to the new CA
        assert await asyncio.to_thread(_served_fingerprint, port) != before
        # Keep creating on the new certificate for a while: 20 more admissions.
        switched = len(results)
        await asyncio.to_thread(
            wait_for, lambda: len(results) >= switched + 20, what="creates after the switch"
        )
        stop.set()
        await asyncio.to_thread(thread.join, 30)
    finally:
        stop.set()
        adm.delete_mutating_webhook_configuration(name)
        await runner.cleanup()
        await client.close()
    failures = [r for r in results if r != "ok"]
    assert len(results) > 20, results
    assert failures == [], (len(results), failures[:3])
