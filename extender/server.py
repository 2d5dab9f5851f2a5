"""The extender's HTTP server: app factory, watches, transport (no decisions).

Decisions live in ``wire`` (ExtenderArgs in, HostPriorityList out) on the
index; this module moves bytes, feeds the index from two informers (nodes,
bound pods), counts and logs. Every answer comes from memory: no API call is
made while the scheduler waits.

Endpoints:
    POST /prioritize       ExtenderArgs -> HostPriorityList (kube-scheduler)
    GET  /v1/images?image= which nodes hold / are pulling an image
    GET  /healthz, /readyz (ready once both watches have listed), /metrics
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from sandman.extender import __version__
from sandman.extender.config import ExtenderConfig
from sandman.extender.index import ImageIndex
from sandman.extender.metrics import ExtenderMetrics
from sandman.extender.observe import node_report, pod_report
from sandman.extender.wire import ArgsError, parse_args, prioritize_pod, where_body
from sandman.informer import Informer
from sandman.kube_async import NODES, PODS, KubeClient
from sandman.serving import metrics_response, run_main, serve_app

log = logging.getLogger("sandman.extender")

# ExtenderArgs carry the whole Pod plus one name per candidate node: ~40 B x
# 5,000 nodes + a pod of tens of KB. 16 MiB leaves room for 100k-node
# clusters and large pods without letting a bad client exhaust memory.
MAX_ARGS_BYTES = 16 << 20


@dataclass
class ExtenderState:
    """One extender app's state: config, the index, metrics, the watches feeding it.

    The failure it guards against is scoring from a half-listed index (pods
    sent away from the nodes that hold their image): ``ready()`` gates both
    /readyz and /prioritize until both watches have listed. Event-loop only.
    """

    config: ExtenderConfig
    index: ImageIndex
    metrics: ExtenderMetrics
    client: KubeClient | None = None
    nodes: Informer | None = None
    pods: Informer | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def ready(self) -> tuple[bool, list[str]]:
        if not self.config.watch:
            return True, []
        missing = [
            name
            for name, inf in (("nodes", self.nodes), ("pods", self.pods))
            if inf is None or not inf.synced.is_set()
        ]
        return not missing, missing

    def on_node(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.index.remove_node(obj["metadata"]["name"])
        else:
            self.index.update_node(node_report(obj))

    def on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        report = None if kind == "DELETED" else pod_report(obj)
        if report is None:
            self.index.remove_pod(obj["metadata"].get("uid", ""))
        else:
            self.index.update_pod(report)


STATE = web.AppKey("state", ExtenderState)


def identity(obj: dict[str, Any]) -> dict[str, Any]:
    """All the informer caches keep of a node or pod: the index holds what
    scoring needs (reports), so a whole object (~35 KB of Python objects per
    sandbox pod) would only be a second, bigger copy of it."""
    md = obj.get("metadata") or {}
    return {"metadata": {k: md[k] for k in ("name", "namespace", "uid") if k in md}}


def pod_informer(client: KubeClient, handler: Any) -> Informer:
    # Only bound pods say anything about images on nodes.
    return Informer(client, PODS, handler, field_selector="spec.nodeName!=", keep=identity)


async def prioritize_handler(request: web.Request) -> web.Response:
    st = request.app[STATE]
    t0 = time.perf_counter()
    if not st.ready()[0]:
        # A half-listed index would send pods away from nodes that hold their
        # image; without our scores the scheduler decides alone (fail open).
        st.metrics.observe("prioritize", 503, time.perf_counter() - t0)
        return web.json_response({"error": "the image index is still syncing"}, status=503)
    try:
        # read() returns the whole body; content.read(n) may return a part.
        raw = await request.read()
        try:
            doc = json.loads(raw)
        except ValueError:
            raise ArgsError("the body is not JSON") from None
        args = parse_args(doc)
    except (ArgsError, web.HTTPRequestEntityTooLarge) as e:
        # Non-200 makes the scheduler ignore us for this pod (ignorable: true).
        st.metrics.observe("prioritize", 400, time.perf_counter() - t0)
        return web.json_response({"error": str(e)}, status=400)
    result = prioritize_pod(st.index, args, st.config.score)
    body = result.body()
    st.metrics.observe("prioritize", 200, time.perf_counter() - t0)
    st.metrics.observe_placement(result.facts, result.ranking.winner)
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "prioritized %s/%s over %d nodes: winner %s",
            (args.pod.get("metadata") or {}).get("namespace", ""),
            (args.pod.get("metadata") or {}).get("name", ""),
            len(args.node_names),
            result.ranking.winner,
        )
    return web.Response(body=body, content_type="application/json")


async def images_handler(request: web.Request) -> web.Response:
    st = request.app[STATE]
    t0 = time.perf_counter()
    image = request.query.get("image", "")
    doc = where_body(st.index, image) if image else None
    code = 200 if doc is not None else 400
    st.metrics.observe("images", code, time.perf_counter() - t0)
    if doc is None:
        return web.json_response(
            {"error": f"?image= must name an image reference, got {image!r}"}, status=400
        )
    return web.json_response(doc)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "version": __version__})


async def readyz(request: web.Request) -> web.Response:
    ok, missing = request.app[STATE].ready()
    return web.json_response({"ok": ok, "waiting_for": missing}, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    st = request.app[STATE]
    st.metrics.refresh(st.index.stats())
    return metrics_response(st.metrics.registry)


def create_app(
    config: ExtenderConfig, client: KubeClient | None, *, index: ImageIndex | None = None
) -> web.Application:
    """The extender app. With ``config.watch`` the index is fed from ``client``'s
    watches; without, the caller owns and fills ``index``."""
    if config.watch and client is None:
        raise ValueError("watching needs a KubeClient")
    state = ExtenderState(
        config=config,
        index=index or ImageIndex(clock=time.monotonic, limits=config.limits),
        metrics=ExtenderMetrics.create(),
        client=client,
    )
    app = web.Application(client_max_size=MAX_ARGS_BYTES)
    app[STATE] = state
    app.router.add_post("/prioritize", prioritize_handler)
    app.router.add_get("/v1/images", images_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.cleanup_ctx.append(_lifecycle)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    st = app[STATE]
    tasks: list[asyncio.Task[None]] = []
    if st.config.watch and st.client is not None:
        st.client.open()
        st.nodes = Informer(st.client, NODES, st.on_node, keep=identity)
        st.pods = pod_informer(st.client, st.on_pod)
        tasks += [
            asyncio.ensure_future(st.nodes.run(st.stop)),
            asyncio.ensure_future(st.pods.run(st.stop)),
        ]
    yield
    st.stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if st.client is not None:
        await st.client.close()


async def _serve(config: ExtenderConfig) -> int:
    client = KubeClient.from_kubeconfig(config.kubeconfig, user_agent="sandman-extender")
    app = create_app(config, client)
    st = app[STATE]
    log.info("extender serving on http://%s:%d (version %s)", config.host, config.port, __version__)
    return await serve_app(
        app,
        host=config.host,
        port=config.port,
        on_stop=st.stop.set,
        background=[lambda: _freeze_when_synced(st)],
    )


async def _freeze_when_synced(st: ExtenderState) -> None:
    """Exempt the initial caches from garbage-collection scans.

    A full collection walks every tracked object: with the informers' caches
    of thousands of nodes and pods (hundreds of thousands of dicts) that
    measured 200-500 ms here, longer than the scheduler waits for us (then our
    scores for that pod are dropped). After the first list the caches are
    mostly immutable JSON; freezing them (``gc.freeze``, the documented
    pre-fork/long-lived-cache idiom) leaves only later objects to scan.
    Process-global, hence here in the process entry and not in the app.
    """
    for inf in (st.nodes, st.pods):
        if inf is not None:
            await inf.synced.wait()
    gc.collect()
    gc.freeze()
    log.info("caches synced; %d objects frozen out of GC scans", gc.get_freeze_count())


def serve(config: ExtenderConfig) -> int:
    return run_main(lambda: _serve(config))
