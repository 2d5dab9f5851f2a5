"""`sandman bench claim`: warm claim -> first command on the real node, against a cold start.

A pool of ``--pool-size`` sandboxes (the `tiny` image, already on the node)
is filled and left to become Ready. Then, from a full pool each time:

- level 1: ``--claims`` claims one after the other, the pool refilled
  between them (a claim in isolation);
- level N (``--levels``): N claims at the same instant, ``--rounds`` times.

Each claim is timed from the request to its first command's result
(``true``): the claim's JSON patch (candidates from one list made before the
clock starts, as the pool manager's informer has them), then the SDK's first
exec on the pod it won. The list a kubectl-only user's ``sandman claim``
makes first is timed apart (``list_ms``). In the same run, ``--cold-runs``
sandboxes are created one at a time (create -> first command) as the baseline
the claims are compared with (``warm_over_cold``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import random
import secrets
import time
from typing import Any

from sandman.bench.report import percentile, table
from sandman.client import Sandbox, SandmanClient, startup
from sandman.contract import LABEL_NODE_KIND
from sandman.harness.testing import real_node_bench
from sandman.kube_async import NAMESPACES, PODS, REPLICASETS, list_all
from sandman.pools.claim import claim
from sandman.pools.spec import PoolSpec, pool_selector

REAL = {LABEL_NODE_KIND: "real"}
COMMAND = ["sleep", "infinity"]
POOL = "bench"
TTL = dt.timedelta(minutes=10)
FILL_TIMEOUT_S = 300.0


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pool-size", type=int, default=8, help="idle pods kept warm")
    p.add_argument("--claims", type=int, default=20, help="claims one at a time")
    p.add_argument("--levels", default="8", help="claims at once, besides one at a time")
    p.add_argument("--rounds", type=int, default=3, help="rounds at each level above 1")
    p.add_argument("--cold-runs", type=int, default=5, help="cold starts, the baseline")
    p.add_argument("--image", default="tiny")


def run(args: argparse.Namespace) -> dict[str, Any]:
    levels = [int(x) for x in args.levels.split(",") if x]
    if any(n < 1 or n > args.pool_size for n in levels):
        raise SystemExit(f"--levels: each between 1 and --pool-size ({args.pool_size})")
    with real_node_bench(args.image) as (cluster, _node, ref):
        results = asyncio.run(_bench(args, cluster.kubeconfig, ref, levels))
    results["image"] = ref
    print(
        table(
            "warm claim -> first command (ms)",
            [
                (k, results[k])
                for k in (
                    "warm_claim_first_command_p50_ms",
                    "warm_claim_first_command_p99_ms",
                    "cold_first_command_p50_ms",
                    "warm_over_cold",
                )
            ]
            + [
                (f"{lv} at once: {k}", doc[k])
                for lv, doc in results["levels"].items()
                for k in ("total_p50_ms", "total_p99_ms", "patch_p50_ms", "exec_p50_ms")
            ],
        )
    )
    return results


async def _bench(
    args: argparse.Namespace, kubeconfig: Any, image: str, levels: list[int]
) -> dict[str, Any]:
    ns = f"bench-claim-{secrets.token_hex(3)}"
    spec = PoolSpec(POOL, image, size=args.pool_size, command=COMMAND, node_selector=REAL)
    async with SandmanClient(kubeconfig=kubeconfig, namespace=ns, transport="direct") as client:
        kube = client.kube
        await kube.create(NAMESPACES, {"metadata": {"name": ns}})
        try:
            # Cold first: the baseline, and the warm-up (namespace key, image).
            cold = []
            for _ in range(args.cold_runs + 1):
                t0 = time.monotonic()
                sb = await Sandbox.create(client, image, command=COMMAND, node_selector=REAL)
                await sb.exec(["true"])
                cold.append((time.monotonic() - t0) * 1000)
                await sb.release()
            cold = cold[1:]  # the first paid for the warm-up
            await kube.create(REPLICASETS, spec.replicaset(), ns)
            out: dict[str, Any] = {"levels": {}}
            rng = random.Random(0)
            for level in [1, *levels]:
                repeats = args.claims if level == 1 else args.rounds
                rows: list[dict[str, float]] = []
                load0 = os.getloadavg()[0]
                for _ in range(repeats):
                    pods = await _full_pool(client, ns, args.pool_size)
                    rows += await asyncio.gather(
                        *(_claim_once(client, ns, pods, rng) for _ in range(level))
                    )
                load1 = os.getloadavg()[0]
                doc = {"samples": len(rows), "load_avg": [round(load0, 2), round(load1, 2)]}
                for key in ("total", "patch", "exec", "list"):
                    vals = [r[key] for r in rows]
                    doc[f"{key}_p50_ms"] = round(percentile(vals, 50), 1)
                    doc[f"{key}_p99_ms"] = round(percentile(vals, 99), 1)
                out["levels"][str(level)] = doc
                print(
                    f"{level} at once: claim -> first command p50 {doc['total_p50_ms']} ms, "
                    f"p99 {doc['total_p99_ms']} ms (patch p50 {doc['patch_p50_ms']}, exec p50 "
                    f"{doc['exec_p50_ms']}; load {load0:.1f} -> {load1:.1f})",
                    flush=True,
                )
        finally:
            await kube.delete(NAMESPACES, ns)
    one = out["levels"]["1"]
    out["warm_claim_first_command_p50_ms"] = one["total_p50_ms"]
    out["warm_claim_first_command_p99_ms"] = one["total_p99_ms"]
    out["cold_first_command_p50_ms"] = round(percentile(cold, 50), 1)
    out["cold_first_command_ms"] = [round(c, 1) for c in cold]
    out["warm_over_cold"] = round(one["total_p50_ms"] / out["cold_first_command_p50_ms"], 4)
    return out


async def _full_pool(client: SandmanClient, ns: str, size: int) -> list[dict[str, Any]]:
    """The pool's idle pods once ``size`` of them are Ready (the ReplicaSet refills)."""
    deadline = time.monotonic() + FILL_TIMEOUT_S
    while True:
        pods, _ = await list_all(client.kube, PODS, ns, label_selector=pool_selector(POOL))
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        if sum(startup.ready(p) for p in live) >= size:
            return live
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool did not refill to {size} Ready pods in {FILL_TIMEOUT_S}s")
        await asyncio.sleep(0.5)


async def _claim_once(
    client: SandmanClient, ns: str, candidates: list[dict[str, Any]], rng: random.Random
) -> dict[str, float]:
    # What `sandman claim` adds in front: its own list of the pool.
    t = time.monotonic()
    await list_all(client.kube, PODS, ns, label_selector=pool_selector(POOL))
    list_ms = (time.monotonic() - t) * 1000
    t0 = time.monotonic()
    res = await claim(
        client.kube, ns, POOL, claimer="bench", ttl=TTL, candidates=candidates, ready_only=True,
        rng=random.Random(rng.random()),
    )  # fmt: skip
    t1 = time.monotonic()
    sb = Sandbox(client, res.pod)
    r = await sb.exec(["true"])
    t2 = time.monotonic()
    if r.exit_code != 0:
        raise RuntimeError(f"{sb.name}: `true` exited {r.exit_code}")
    await sb.release()
    return {
        "total": (t2 - t0) * 1000,
        "patch": (t1 - t0) * 1000,
        "exec": (t2 - t1) * 1000,
        "list": list_ms,
    }
