"""The reaper process: health and metrics over HTTP, the controller, leadership."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from sandman import tokens
from sandman.events import EventRecorder
from sandman.kube_async import SECRETS, ApiError, KubeClient
from sandman.leader import LeaderElector
from sandman.reaper.config import ReaperConfig
from sandman.reaper.controller import Reaper
from sandman.reaper.metrics import ReaperMetrics
from sandman.reaper.outage import AdmissionHealth
from sandman.reaper.probe import WebhookProbe
from sandman.serving import metrics_response, run_main, serve_app
from sandman.tokens import AdmissionKeys

log = logging.getLogger("sandman.reaper")


@dataclass
class ReaperState:
    config: ReaperConfig
    client: KubeClient
    metrics: ReaperMetrics = field(default_factory=ReaperMetrics.create)
    reaper: Reaper | None = None
    elector: LeaderElector | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)


STATE = web.AppKey("state", ReaperState)


# Rotations and retirements are rare and not urgent for the reaper (a pod
# admitted under a generation it does not know yet is only left alone until
# then): a GET every 15 s, no list/watch right on Secrets.
KEYS_POLL_S = 15.0


async def read_admission_keys(client: KubeClient, namespace: str) -> AdmissionKeys | None:
    """What verifies admission markers (``sandman.tokens``); None until the webhook wrote it."""
    try:
        s = await client.get(SECRETS, tokens.ADMISSION_KEY_SECRET, namespace)
        return AdmissionKeys.from_secret_data(s.get("data") or {})
    except (ApiError, OSError, TimeoutError, tokens.KeySecretError) as e:
        log.warning("no admission keys yet (%s): no sandbox is acted on until there are", e)
        return None


async def watch_admission_keys(reaper: Reaper, client: KubeClient, namespace: str) -> None:
    while True:
        keys = await read_admission_keys(client, namespace)
        if keys is not None and keys != reaper.keys:
            reaper.keys_changed(keys)
        await asyncio.sleep(KEYS_POLL_S)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    st = request.app[STATE]
    r = st.reaper
    # Ready once the cache is synced and the webhook probe has answered (the
    # probe's first reading is the baseline later failures are counted from).
    synced = r is not None and r.informer.synced.is_set() and (r.health is None or r.health.known)
    leading = r is not None and r.is_leader()
    return web.json_response({"ok": synced, "leader": leading}, status=200 if synced else 503)


async def metrics(request: web.Request) -> web.Response:
    st = request.app[STATE]
    r = st.reaper
    cache = None
    if r is not None and r.is_leader() and r.informer.synced.is_set():
        cache = (r.informer.store.values(), r.clock())  # the inventory: leader only
    st.metrics.refresh(st.client.requests, cache)
    return metrics_response(st.metrics.registry)


def create_app(config: ReaperConfig, client: KubeClient) -> web.Application:
    app = web.Application()
    app[STATE] = ReaperState(config, client)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.cleanup_ctx.append(_lifecycle)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    st = app[STATE]
    cfg = st.config
    st.client.open()
    recorder = EventRecorder(st.client, "sandman-reaper")
    health = AdmissionHealth() if cfg.options.extension_grace > dt.timedelta(0) else None
    reaper = Reaper(
        st.client,
        cfg.options,
        st.metrics,
        elector=None,
        recorder=recorder,
        keys=await read_admission_keys(st.client, cfg.keys_namespace),
        health=health,
        namespace=cfg.watch_namespace,
    )
    if cfg.leader_elect:
        st.elector = LeaderElector(
            st.client,
            namespace=cfg.namespace,
            name=cfg.lease_name,
            identity=cfg.identity,
            lease_duration=cfg.lease_duration,
            renew_deadline=cfg.renew_deadline,
            retry_period=cfg.retry_period,
            on_change=reaper.leadership_changed,
        )
        reaper.elector = st.elector
    else:
        st.metrics.is_leader.set(1)
    st.reaper = reaper
    tasks = [
        asyncio.ensure_future(reaper.run(st.stop)),
        asyncio.ensure_future(recorder.run(st.stop)),
        asyncio.ensure_future(watch_admission_keys(reaper, st.client, cfg.keys_namespace)),
    ]
    if health is not None:
        probe = WebhookProbe(
            st.client, health, config_name=cfg.webhook_config, webhook_name=cfg.webhook_name
        )
        tasks.append(asyncio.ensure_future(probe.run(st.stop)))
    if st.elector is not None:
        tasks.append(asyncio.ensure_future(st.elector.run(st.stop)))
    yield
    st.stop.set()
    for t in tasks[2:]:
        t.cancel()  # the key and probe loops sleep; the others end on stop
    await asyncio.gather(*tasks, return_exceptions=True)
    await st.client.close()


async def _serve(config: ReaperConfig) -> int:
    client = KubeClient.from_kubeconfig(config.kubeconfig, user_agent="sandman-reaper")
    app = create_app(config, client)
    log.info(
        "reaper %s on http://%s:%d (dry run: %s)",
        config.identity,
        config.host,
        config.port,
        config.options.dry_run,
    )
    return await serve_app(app, host=config.host, port=config.port)


def serve(config: ReaperConfig) -> int:
    return run_main(lambda: _serve(config))
