"""`sandman bench webhook`: what admission costs.

1. Admission latency: recorded AdmissionReviews (a realistic sandbox pod) sent
   straight to the running webhook over HTTPS at a fixed rate, /mutate and
   /validate, p50/p99 as the client sees them.
2. Pod-create throughput through the real apiserver, with and without the
   webhook in the path, same run, interleaved rounds: unlabeled pods (the
   apiserver never calls the webhook) vs sandbox pods (mutating and
   validating webhooks both called). Pods land on kwok nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as cf
import json
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes.client import CoreV1Api

from sandman.bench.report import percentile, table
from sandman.contract import ANN_TTL, LABEL_SANDBOX
from sandman.harness.cluster import admission
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, on_kwok
from sandman.harness.kube import api_client
from sandman.harness.probes import insecure_context
from sandman.harness.testing import bench_bed


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rate", type=float, default=200.0, help="reviews per second")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--pods", type=int, default=300, help="pods per round and variant")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=32)


def _pod(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "bench-",
            "labels": labels,
            "annotations": {ANN_TTL: "30m"},
        },
        "spec": on_kwok(
            {
                "containers": [
                    {
                        "name": "main",
                        "image": KWOK_IMAGE,
                        "command": ["sleep", "infinity"],
                        "env": [{"name": "TASK", "value": "swe-123"}],
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                    },
                    {"name": "helper", "image": KWOK_IMAGE},
                ],
            }
        ),
    }


def _review(uid: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default",
            "operation": "CREATE",
            # The apiserver fills in the namespace before admission; the
            # webhook refuses a review whose object says otherwise.
            "object": {**obj, "metadata": {**obj["metadata"], "namespace": "default"}},
            "userInfo": {"username": "bench"},
            "dryRun": False,
        },
    }


async def admission_latency(
    url: str, rate: float, seconds: float, client_cert: tuple[Path, Path]
) -> dict[str, list[float]]:
    ctx = insecure_context()
    ctx.load_cert_chain(*client_cert)  # the webhook answers only the apiserver's certificate
    obj = _pod({LABEL_SANDBOX: "true"})
    injected = None
    out: dict[str, list[float]] = {"mutate": [], "validate": []}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=64)) as http:
        # The validating webhook sees the mutated pod: record it once.
        async with http.post(url + "/mutate", json=_review("seed", obj)) as r:
            resp = (await r.json())["response"]
        injected = _apply_patch(obj, json.loads(__import__("base64").b64decode(resp["patch"])))
        bodies = {"mutate": obj, "validate": injected}

        async def one(endpoint: str, i: int) -> None:
            body = json.dumps(_review(f"u-{i}", bodies[endpoint])).encode()
            t = time.perf_counter()
            async with http.post(
                url + "/" + endpoint, data=body, headers={"Content-Type": "application/json"}
            ) as r:
                doc = await r.json()
            out[endpoint].append((time.perf_counter() - t) * 1000)
            assert doc["response"]["allowed"], doc

        tasks = []
        start = time.perf_counter()
        n = int(rate * seconds)
        for i in range(n):
            # Open loop at a fixed rate: a slow answer does not slow the sender.
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one("mutate" if i % 2 == 0 else "validate", i)))
        await asyncio.gather(*tasks)
    return out


def _apply_patch(doc: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    from copy import deepcopy

    doc = deepcopy(doc)
    for op in patch:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = doc
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        last = parts[-1]
        if op["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
        elif isinstance(target, list):
            target.append(op["value"]) if last == "-" else target.insert(int(last), op["value"])
        else:
            target[last] = op["value"]
    return doc


def create_rate(
    core: CoreV1Api, ns: str, labels: dict[str, str], n: int, concurrency: int
) -> float:
    pod = _pod(labels)

    def create(_: int) -> None:
        core.create_namespaced_pod(ns, pod, _preload_content=False)

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(create, range(n)))
    return n / (time.perf_counter() - t0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    bed = bench_bed(need_real_node=False)
    try:
        cluster = bed.cluster
        deployment = cluster.deployment
        if deployment is None:
            raise RuntimeError("the cluster runs no webhook: `sandman cluster up --deploy`")
        cert = admission.client_cert(cluster.layout.pki)
        lat = asyncio.run(admission_latency(deployment.webhook_url, args.rate, args.seconds, cert))
        core = CoreV1Api(api_client(cluster.kubeconfig))
        ns = f"bench-webhook-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": ns}})
        try:
            without, with_ = [], []
            for _ in range(args.rounds):
                without.append(
                    create_rate(core, ns, {"bench": "plain"}, args.pods, args.concurrency)
                )
                with_.append(
                    create_rate(core, ns, {LABEL_SANDBOX: "true"}, args.pods, args.concurrency)
                )
        finally:
            core.delete_namespace(ns)
    finally:
        bed.close()
    both = lat["mutate"] + lat["validate"]
    results = {
        "admission_p50_ms": percentile(both, 50),
        "admission_p99_ms": percentile(both, 99),
        "mutate_p99_ms": percentile(lat["mutate"], 99),
        "validate_p99_ms": percentile(lat["validate"], 99),
        "admission_rate_per_s": args.rate,
        "reviews": len(both),
        "create_per_s_without": sum(without) / len(without),
        "create_per_s_with": sum(with_) / len(with_),
        "create_rate_ratio": sum(with_) / sum(without),
        "pods_per_round": args.pods,
        "rounds": args.rounds,
    }
    print(table("webhook", list(results.items())))
    return results
