"""The reaper process: health and metrics over HTTP, the controller, leadership."""

from __future__ import annotations

import asyncio
import base64
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
from sandman.serving import metrics_response, run_main, serve_app

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


async def read_cluster_key(client: KubeClient, namespace: str) -> bytes | None:
    """The key to derive daemon tokens (idle polls); None disables idle checks."""
    try:
        s = await client.get(SECRETS, tokens.CLUSTER_KEY_SECRET, namespace)
        return base64.b64decode(s["data"][tokens.KEY_FIELD])
    except (ApiError, KeyError) as e:
        log.warning("no cluster key (%s): idle sandboxes cannot be detected", e)
        return None


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    st = request.app[STATE]
    synced = st.reaper is not None and st.reaper.informer.synced.is_set()
    leading = st.reaper is not None and st.reaper.is_leader()
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
    key = await read_cluster_key(st.client, cfg.namespace)
    recorder = EventRecorder(st.client, "sandman-reaper")
    reaper = Reaper(
        st.client,
        cfg.options,
        st.metrics,
        elector=None,
        recorder=recorder,
        cluster_key=key,
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
    ]
    if st.elector is not None:
        tasks.append(asyncio.ensure_future(st.elector.run(st.stop)))
    yield
    st.stop.set()
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
