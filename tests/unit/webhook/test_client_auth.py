"""Only the apiserver gets reviews answered: the webhook's TLS asks for a client
certificate (--client-ca-file), and /mutate and /validate refuse a caller
without an accepted one, undecided, while probes and scrapes need none.

The real handlers behind a real TLS listener (CertManager in file mode); the
refusals come before any rule, lookup or Kubernetes call, so no client is needed.
"""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from sandman import tls
from sandman.webhook.certs import CertManager
from sandman.webhook.config import WebhookConfig
from sandman.webhook.metrics import WebhookMetrics
from sandman.webhook.server import STATE, WebhookState, healthz, mutate_handler, validate_handler

NOW = dt.datetime.now(dt.UTC)  # the client checks the server cert's dates
HOUR = dt.timedelta(hours=1)
APISERVER_CN = "kube-apiserver-admission-client"


def write(tmp: Path, name: str, kp: tls.KeyPair) -> tuple[Path, Path]:
    crt, key = tmp / f"{name}.crt", tmp / f"{name}.key"
    crt.write_bytes(kp.cert_pem)
    key.write_bytes(kp.key_pem)
    return crt, key


def review(namespace: str = "team", object_namespace: str = "team") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": {"kind": "Pod", "metadata": {"name": "p", "namespace": object_namespace}},
        },
    }


class Served:
    def __init__(self, tmp: Path, cns: tuple[str, ...] = ()) -> None:
        self.tmp = tmp
        self.server_ca = tls.new_ca("server-ca", now=NOW, valid_for=HOUR)
        self.client_ca = tls.new_ca("client-ca", now=NOW, valid_for=HOUR)
        serving = tls.issue(
            self.server_ca, "127.0.0.1", now=NOW, valid_for=HOUR, ips=["127.0.0.1"], server=True
        )
        crt, key = write(tmp, "tls", serving)
        (tmp / "client-ca.crt").write_bytes(self.client_ca.cert_pem)
        self.config = WebhookConfig(client_ca_file=tmp / "client-ca.crt", client_cns=cns)
        self.certs = CertManager(
            None,
            namespace="unused",
            secret_name="unused",
            dns_names=(),
            ca_validity=HOUR,
            cert_validity=HOUR,
            cert_file=crt,
            key_file=key,
            work_dir=tmp / "work",
            client_ca_file=self.config.client_ca_file,
        )
        self.state = WebhookState(config=self.config, client=None, metrics=WebhookMetrics.create())  # type: ignore[arg-type]

    async def start(self) -> str:
        await self.certs.reconcile()
        app = web.Application()
        app[STATE] = self.state
        app.router.add_post("/mutate", mutate_handler)
        app.router.add_post("/validate", validate_handler)
        app.router.add_get("/healthz", healthz)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=self.certs.ssl_context())
        await site.start()
        return f"https://127.0.0.1:{self.runner.addresses[0][1]}"

    def client_ctx(self, ca: tls.KeyPair | None = None, cn: str = APISERVER_CN) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.server_ca.cert_pem.decode())
        if ca is not None:
            kp = tls.issue(ca, cn, now=NOW, valid_for=HOUR, client=True)
            ctx.load_cert_chain(*write(self.tmp, "client", kp))
        return ctx

    def refused(self, endpoint: str, reason: str) -> float:
        v = self.state.metrics.registry.get_sample_value(
            "sandman_webhook_unauthenticated_reviews_total",
            {"endpoint": endpoint, "reason": reason},
        )
        return v or 0.0


async def post(url: str, ctx: ssl.SSLContext, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body, ssl=ctx) as r:
        return r.status, await r.json()


async def test_reviews_need_the_apiservers_certificate_probes_do_not(tmp_path: Path) -> None:
    served = Served(tmp_path)
    url = await served.start()
    try:
        anonymous = served.client_ctx()
        # Probes and scrapes: no certificate needed.
        async with aiohttp.ClientSession() as s, s.get(url + "/healthz", ssl=anonymous) as r:
            assert r.status == 200
        # A review without a certificate: 403, a JSON error, nothing decided.
        for endpoint in ("mutate", "validate"):
            status, body = await post(f"{url}/{endpoint}", anonymous, review())
            assert status == 403 and "no client certificate" in body["error"], body
            assert served.refused(endpoint, "certificate") == 1
        assert served.state.metrics.registry.get_sample_value(
            "sandman_webhook_admissions_total", {"endpoint": "mutate", "result": "denied"}
        ) in (None, 0.0)
        # The apiserver's certificate gets past authentication: the forged
        # namespace below is then refused by the consistency check (400), the
        # proof that the request reached the review.
        apiserver = served.client_ctx(served.client_ca)
        status, body = await post(f"{url}/mutate", apiserver, review(namespace="other"))
        assert status == 400 and "differs from request.namespace 'other'" in body["error"], body
        assert served.refused("mutate", "inconsistent") == 1
        # A certificate from another CA does not even complete the handshake.
        other = served.client_ctx(tls.new_ca("other-ca", now=NOW, valid_for=HOUR))
        with pytest.raises(aiohttp.ClientError):
            await post(f"{url}/mutate", other, review())
    finally:
        await served.runner.cleanup()


async def test_an_allowed_cn_list_refuses_other_certificates_of_the_ca(tmp_path: Path) -> None:
    served = Served(tmp_path, cns=(APISERVER_CN,))
    url = await served.start()
    try:
        someone = served.client_ctx(served.client_ca, cn="someone-else")
        status, body = await post(f"{url}/validate", someone, review())
        assert status == 403 and "'someone-else'" in body["error"], body
        apiserver = served.client_ctx(served.client_ca)
        status, _ = await post(f"{url}/validate", apiserver, review(object_namespace="x"))
        assert status == 400  # authenticated; refused as inconsistent
    finally:
        await served.runner.cleanup()


async def test_a_rotated_client_ca_is_trusted_without_a_restart(tmp_path: Path) -> None:
    served = Served(tmp_path)
    url = await served.start()
    try:
        new_ca = tls.new_ca("client-ca-2", now=NOW, valid_for=HOUR)
        with pytest.raises(aiohttp.ClientError):
            await post(f"{url}/mutate", served.client_ctx(new_ca), review())
        # The mounted ConfigMap now holds both CAs (a rotation adds the new one first).
        (tmp_path / "client-ca.crt").write_bytes(served.client_ca.cert_pem + new_ca.cert_pem)
        await served.certs.reconcile()  # the periodic pass notices the new content
        status, _ = await post(f"{url}/mutate", served.client_ctx(new_ca), review(namespace="x"))
        assert status == 400  # authenticated, then refused as inconsistent
        status, _ = await post(
            f"{url}/mutate", served.client_ctx(served.client_ca), review(namespace="x")
        )
        assert status == 400
    finally:
        await served.runner.cleanup()
