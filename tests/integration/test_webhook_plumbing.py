"""The apiserver reaches an HTTPS admission webhook on the host by URL.

This is the plumbing every later component relies on (the webhook runs as a
host process in local mode), proved with a minimal mutating webhook.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import ssl
import tempfile
from pathlib import Path

from aiohttp import web
from kubernetes.client import AdmissionregistrationV1Api, CoreV1Api

from sandman import tls
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import api_client, raw


def _serving_ctx(tmp: Path) -> tuple[ssl.SSLContext, bytes]:
    now = dt.datetime.now(dt.UTC)
    ca = tls.new_ca("plumbing-test-ca", now=now, valid_for=dt.timedelta(hours=1))
    kp = tls.issue(
        ca, "127.0.0.1", now=now, valid_for=dt.timedelta(hours=1), ips=["127.0.0.1"], server=True
    )
    (tmp / "tls.crt").write_bytes(kp.cert_pem)
    (tmp / "tls.key").write_bytes(kp.key_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
    return ctx, ca.cert_pem


async def test_url_webhook_on_host_mutates_pod(cluster: LocalCluster, namespace: str) -> None:
    seen: list[str] = []

    async def mutate(request: web.Request) -> web.Response:
        review = await request.json()
        req = review["request"]
        seen.append(req["operation"])
        patch = [{"op": "add", "path": "/metadata/annotations", "value": {"plumbing": "ok"}}]
        return web.json_response(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": req["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                },
            }
        )

    app = web.Application()
    app.router.add_post("/mutate", mutate)
    runner = web.AppRunner(app)
    await runner.setup()
    with tempfile.TemporaryDirectory() as tmp:
        ctx, ca_pem = _serving_ctx(Path(tmp))
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        port = runner.addresses[0][1]
        adm = AdmissionregistrationV1Api(api_client(cluster.kubeconfig))
        core = CoreV1Api(api_client(cluster.kubeconfig))
        name = f"plumbing-{namespace}"
        adm.create_mutating_webhook_configuration(
            {
                "metadata": {"name": name},
                "webhooks": [
                    {
                        "name": "plumbing.sandman.dev",
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{port}/mutate",
                            "caBundle": base64.b64encode(ca_pem).decode(),
                        },
                        "rules": [
                            {
                                "operations": ["CREATE"],
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "resources": ["pods"],
                            }
                        ],
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": namespace}
                        },
                        "objectSelector": {"matchLabels": {"plumbing": "yes"}},
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "None",
                        "failurePolicy": "Fail",
                        "timeoutSeconds": 5,
                    }
                ],
            }
        )
        try:
            pod = {
                "metadata": {"generateName": "p-", "labels": {"plumbing": "yes"}},
                "spec": on_kwok({"containers": [{"name": "c", "image": KWOK_IMAGE}]}),
            }
            # Webhook configurations reach the apiserver's admission chain
            # through an informer: retry briefly until ours is in effect.
            created = None
            for _ in range(50):
                created = raw(
                    await asyncio.to_thread(
                        core.create_namespaced_pod, namespace, pod, _preload_content=False
                    )
                )
                if created["metadata"].get("annotations", {}).get("plumbing") == "ok":
                    break
                await asyncio.sleep(0.2)
            assert created is not None
            assert created["metadata"]["annotations"]["plumbing"] == "ok"
            assert "CREATE" in seen
            # An unlabeled pod is not sent to the webhook at all.
            before = len(seen)
            plain = raw(
                await asyncio.to_thread(
                    core.create_namespaced_pod,
                    namespace,
                    {
                        "metadata": {"name": "plain"},
                        "spec": on_kwok({"containers": [{"name": "c", "image": KWOK_IMAGE}]}),
                    },
                    _preload_content=False,
                )
            )
            assert "plumbing" not in (plain["metadata"].get("annotations") or {})
            assert len(seen) == before
        finally:
            adm.delete_mutating_webhook_configuration(name)
            await runner.cleanup()
