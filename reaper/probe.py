"""Is the admission webhook there? Asked the way the apiserver asks it (I/O).

The reaper reads the ValidatingWebhookConfiguration (the webhook's address
and CA bundle, exactly what the apiserver uses), sends the webhook a dry-run
review of its own every few seconds, and records the answer in an
``AdmissionHealth`` (``outage.py`` decides what that means for leases). A
configuration that does not exist means no webhook stands between clients and
their lease extensions: the health is "up". Needs only ``get`` on that one
configuration; the review carries no pod of anyone's.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import itertools
import logging
import ssl
from collections.abc import Callable
from typing import Any

import aiohttp

from sandman.clock import utc_now
from sandman.contract import NAMESPACE
from sandman.kube_async import VALIDATING_WEBHOOKS, ApiError, KubeClient, sleep_or
from sandman.reaper.outage import AdmissionHealth

log = logging.getLogger("sandman.reaper")

# Every 5 s: an outage is noticed well inside the 2 min grace, at one small
# request per period (the webhook answers a review of a protected namespace
# without any API call).
PROBE_PERIOD_S = 5.0
# The apiserver's default webhook timeout is 10 s; ours (manifests) is 5 s.
PROBE_TIMEOUT_S = 5.0


def webhook_url(hook: dict[str, Any]) -> str:
    cc = hook.get("clientConfig") or {}
    if cc.get("url"):
        return str(cc["url"])
    svc = cc.get("service") or {}
    port = svc.get("port", 443)
    return f"https://{svc['name']}.{svc['namespace']}.svc:{port}{svc.get('path', '')}"


def ssl_context(hook: dict[str, Any]) -> ssl.SSLContext:
    ca = (hook.get("clientConfig") or {}).get("caBundle")
    if ca:
        return ssl.create_default_context(cadata=base64.b64decode(ca).decode())
    return ssl.create_default_context()


def probe_review(uid: str) -> dict[str, Any]:
    """A dry-run UPDATE of a pod in Sandman's own namespace: every webhook of
    ours answers it at once (protected namespace), and nothing is recorded."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "reaper-probe"}}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "UPDATE",
            "namespace": NAMESPACE,
            "name": "reaper-probe",
            "object": pod,
            "oldObject": pod,
            "dryRun": True,
            "userInfo": {"username": "system:serviceaccount:sandman-system:sandman-reaper"},
        },
    }


class WebhookProbe:
    """Probes one webhook of one configuration. Event-loop only."""

    def __init__(
        self,
        client: KubeClient,
        health: AdmissionHealth,
        *,
        config_name: str,
        webhook_name: str,
        clock: Callable[[], dt.datetime] = utc_now,
    ) -> None:
        self.client = client
        self.health = health
        self.config_name = config_name
        self.webhook_name = webhook_name
        self.clock = clock
        self._uids = itertools.count(1)

    async def check(self, http: aiohttp.ClientSession) -> bool:
        """True if the webhook answers a review (or none is configured)."""
        try:
            cfg = await self.client.get(VALIDATING_WEBHOOKS, self.config_name)
        except ApiError as e:
            if e.not_found:
                return True  # no webhook between clients and their extensions
            raise
        hook = next(
            (h for h in cfg.get("webhooks") or [] if h.get("name") == self.webhook_name), None
        )
        if hook is None:
            return True
        uid = f"sandman-reaper-probe-{next(self._uids)}"
        try:
            async with http.post(
                webhook_url(hook),
                json=probe_review(uid),
                ssl=ssl_context(hook),
                timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
            ) as r:
                if r.status != 200:
                    return False
                doc = await r.json()
                return (doc.get("response") or {}).get("uid") == uid
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, ssl.SSLError) as e:
            log.debug("webhook %s unreachable: %s", self.webhook_name, e)
            return False

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as http:
            while not stop.is_set():
                try:
                    ok = await self.check(http)
                except (ApiError, OSError, TimeoutError) as e:
                    log.warning("cannot read webhook configuration %s: %s", self.config_name, e)
                    ok = False  # not knowing is not "up": leases stay held
                was_down = self.health.down_since is not None
                self.health.observe(self.clock(), ok)
                if ok == was_down:
                    log.warning(
                        "admission webhook %s is %s", self.webhook_name, "back" if ok else "down"
                    )
                await sleep_or(stop, PROBE_PERIOD_S)
