"""Is the admission webhook there, and did the apiserver fail to call it? (I/O)

Every few seconds the reaper reads the ValidatingWebhookConfiguration (the
webhook's address and CA bundle, exactly what the apiserver uses) and asks
the webhook's ``GET /readyz`` on that host and port, verified with that CA
bundle. It sends no AdmissionReview: ``/mutate`` and ``/validate`` are the
apiserver's (they may ask for its client certificate), and a readiness
answer is all the rule needs.

While the webhook is not seen serving, the reaper also reads the apiserver's
own count of UPDATEs it refused because it could not call the webhook
(``apiserver_metrics.py``): that, not the reaper's view, says whether a lease
extension was refused. It is read only then (the apiserver's ``/metrics`` is
megabytes in a big cluster), so its cost is a few readings while a fresh
install starts, and one per period during an outage. The observations go to
an ``AdmissionHealth`` (``outage.py`` decides what they mean for leases).

A configuration that does not exist means no webhook stands between clients
and their lease extensions: the webhook counts as serving. Needs ``get`` on
that one configuration and ``get`` on the nonResourceURL ``/metrics``.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from sandman.clock import utc_now
from sandman.kube_async import VALIDATING_WEBHOOKS, ApiError, KubeClient, sleep_or
from sandman.reaper.apiserver_metrics import call_failures, rose
from sandman.reaper.outage import AdmissionHealth, Observation

log = logging.getLogger("sandman.reaper")

# Every 5 s: an outage is noticed well inside the 2 min grace, at one small
# request per period.
PROBE_PERIOD_S = 5.0
# The apiserver's default webhook timeout is 10 s; ours (manifests) is 5 s.
PROBE_TIMEOUT_S = 5.0
# The apiserver's /metrics: a few MB in a large cluster; 64 MiB bounds a
# misbehaving endpoint at about ten times that, read at most once per period.
METRICS_MAX_BYTES = 64 << 20
METRICS_TIMEOUT_S = 10.0


def readyz_url(hook: dict[str, Any]) -> str:
    """The webhook's /readyz on the host and port its configuration names."""
    cc = hook.get("clientConfig") or {}
    if cc.get("url"):
        u = urlsplit(str(cc["url"]))
        return f"{u.scheme}://{u.netloc.rpartition('@')[2]}/readyz"
    svc = cc.get("service") or {}
    port = svc.get("port", 443)
    return f"https://{svc['name']}.{svc['namespace']}.svc:{port}/readyz"


def ssl_context(hook: dict[str, Any]) -> ssl.SSLContext:
    ca = (hook.get("clientConfig") or {}).get("caBundle")
    if ca:
        return ssl.create_default_context(cadata=base64.b64decode(ca).decode())
    return ssl.create_default_context()


async def read_call_failures(client: KubeClient, webhook: str) -> float:
    """The apiserver's count for ``webhook`` (apiserver_metrics.py), from GET /metrics.

    Through the client's pool and credentials (no verb of its own: /metrics is
    text, not an API object), streamed line by line and bounded."""
    headers = {**await client.auth_headers(), "Accept": "text/plain"}
    async with client.session().get(
        client.creds.server + "/metrics",
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=METRICS_TIMEOUT_S),
        **client.request_options(),
    ) as r:
        if r.status != 200:
            raise ApiError(r.status, (await r.content.read(4096)).decode(errors="replace"))
        lines: list[str] = []
        read = 0
        async for raw in r.content:  # aiohttp bounds each line
            read += len(raw)
            if read > METRICS_MAX_BYTES:
                raise ValueError(f"apiserver /metrics over {METRICS_MAX_BYTES} bytes")
            if raw.startswith(b"apiserver_admission_webhook_rejection_count{"):
                lines.append(raw.decode(errors="replace"))
        return call_failures(lines, webhook)


class WebhookProbe:
    """Probes one webhook of one configuration. Event-loop only.

    Keeps the apiserver's last count (the baseline for the next reading); a
    reading that fails leaves it, so the next good one covers the gap.
    """

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
        self._count: float | None = None

    async def serving(self, http: aiohttp.ClientSession) -> bool:
        """True if the webhook answers /readyz with 200 (or none is configured)."""
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
        try:
            async with http.get(
                readyz_url(hook),
                ssl=ssl_context(hook),
                timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
                allow_redirects=False,
            ) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, ssl.SSLError) as e:
            log.debug("webhook %s unreachable: %s", self.webhook_name, e)
            return False

    async def call_failures(self) -> bool | None:
        """Whether the apiserver failed to call the webhook since the last
        reading; None if its count cannot be read."""
        try:
            count = await read_call_failures(self.client, self.webhook_name)
        except (ApiError, aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            log.warning("cannot read the apiserver's webhook failure count: %s", e)
            return None
        previous, self._count = self._count, count
        return rose(previous, count)

    async def observe(self, http: aiohttp.ClientSession) -> Observation:
        try:
            ok = await self.serving(http)
        except (ApiError, OSError, TimeoutError) as e:
            log.warning("cannot read webhook configuration %s: %s", self.config_name, e)
            ok = False  # not knowing is not "up"
        at = self.clock()
        return Observation(at, True) if ok else Observation(at, False, await self.call_failures())

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as http:
            while not stop.is_set():
                o = await self.observe(http)
                was = self.health.current
                self.health.observe(o)
                now = self.health.current
                if now is not None and (was is None or was.kind is not now.kind):
                    log.warning("admission webhook %s: %s", self.webhook_name, now.describe())
                elif now is None and was is not None:
                    log.warning("admission webhook %s is back", self.webhook_name)
                await sleep_or(stop, PROBE_PERIOD_S)
