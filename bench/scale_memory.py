"""`sandman bench memory`: the state bytes each component keeps per tracked pod.

The components' own code, fed in process: N copies of a real injected sandbox
pod (``bench/data/sandbox_pod.json``, as the apiserver served it: bound to a
kwok node, Running, Ready; each copy with its own name, uid, sandbox id,
IP and node) go through a relist of the component's informer exactly as a
watch would deliver them, into the reaper's controller (informer cache,
delay queue) and the extender's state (informer cache, image index).
tracemalloc counts the bytes that stay allocated, divided by N. "whole pods"
is the same with the informer keeping whole objects (how both components ran
before ``Informer(keep=...)``), for the before/after in docs/scale.md.

The webhook keeps nothing per pod (it watches namespaces and caches image
configs by reference), so it has no row here.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import ssl
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandman.bench.report import table
from sandman.contract import LABEL_ID
from sandman.informer import Informer
from sandman.kube_async import Credentials, KubeClient

POD = Path(__file__).parent / "data" / "sandbox_pod.json"
NODES = 114  # 12,500 sandboxes at 110 a node


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pods", type=int, default=5000)


def pods(n: int) -> list[dict[str, Any]]:
    """``n`` distinct copies of the recorded sandbox pod, as JSON text decoded
    one by one (shared strings are not shared, as on the wire)."""
    base = json.loads(POD.read_text())
    out = []
    for i in range(n):
        p = copy.deepcopy(base)
        md = p["metadata"]
        md["name"] = f"sb-{i:06d}"
        md["uid"] = f"{i:08d}-0000-4000-8000-000000000000"
        md["labels"][LABEL_ID] = f"{i:016x}"
        p["spec"]["nodeName"] = f"scale-node-{i % NODES}"
        p["status"]["podIP"] = f"10.160.{i // 250}.{i % 250}"
        out.append(json.loads(json.dumps(p)))
    return out


class _Pages:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    async def list(self, res: Any, namespace: Any = None, **params: Any) -> dict[str, Any]:
        i = int(params.get("continue_") or 0)
        page = self.items[i * 500 : (i + 1) * 500]
        md: dict[str, Any] = {"resourceVersion": "1"}
        if (i + 1) * 500 < len(self.items):
            md["continue"] = str(i + 1)
        return {"items": page, "metadata": md}


def _client() -> KubeClient:
    return KubeClient(Credentials("https://127.0.0.1:1", ssl.create_default_context()))


def _measure(build: Callable[[_Pages], Informer], n: int) -> float:
    """Bytes still allocated per pod once an informer built by ``build`` listed
    ``n`` pods (the list's own JSON is freed, as after a real relist page)."""
    stub = _Pages([])
    gc.collect()
    tracemalloc.start()
    inf = build(stub)
    base = tracemalloc.get_traced_memory()[0]
    # Decoded after the baseline and dropped after the relist: what stays is
    # what the component kept.
    stub.items = pods(n)
    asyncio.run(inf._relist())
    stub.items = []
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return held / n


def reaper(keep_whole: bool) -> Callable[[_Pages], Informer]:
    from sandman.reaper.controller import Reaper, ReaperOptions
    from sandman.reaper.metrics import ReaperMetrics

    def build(stub: _Pages) -> Informer:
        r = Reaper(_client(), ReaperOptions(), ReaperMetrics.create(), elector=None, recorder=None)
        r.informer.client = stub  # type: ignore[assignment]
        if keep_whole:
            r.informer.keep = lambda o: o
        build.keepalive = r  # type: ignore[attr-defined]
        return r.informer

    return build


def extender(keep_whole: bool) -> Callable[[_Pages], Informer]:
    from sandman.extender.config import ExtenderConfig
    from sandman.extender.index import ImageIndex
    from sandman.extender.metrics import ExtenderMetrics
    from sandman.extender.server import ExtenderState, pod_informer

    def build(stub: _Pages) -> Informer:
        cfg = ExtenderConfig(watch=False)
        st = ExtenderState(cfg, ImageIndex(clock=time.monotonic), ExtenderMetrics.create())
        inf = pod_informer(stub, st.on_pod)  # type: ignore[arg-type]
        if keep_whole:
            inf.keep = lambda o: o
        build.keepalive = st  # type: ignore[attr-defined]
        return inf

    return build


def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.pods
    results: dict[str, Any] = {"pods": n, "pod_json_bytes": len(POD.read_bytes())}
    for name, make in (("reaper", reaper), ("extender", extender)):
        results[f"{name}_bytes_per_pod"] = round(_measure(make(False), n))
        results[f"{name}_bytes_per_pod_whole_pods"] = round(_measure(make(True), n))
    print(table("state bytes per tracked pod", list(results.items())))
    return results
