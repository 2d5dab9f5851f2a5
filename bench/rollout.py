"""RL batch strategies side by side: none/naive/sliding/pipelined, reuse off and on.

Two scenarios in one run, every strategy timed from before any warming:
- real: P problems x R rollouts at concurrency C on the real node, one image
  per problem (fresh tags per run, so each run pulls), a tiny task of a few
  commands whose reward is 1 only if it found the sandbox pristine.
- kwok: the design's 100 x 8 at concurrency 64 on simulated nodes with the
  real control plane (creations, claims, scheduling and readiness are real; a
  kwok pod runs no daemon, so the task and the reset are timed waits).
Headline keys compare against the `none` baseline of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
from pathlib import Path
from typing import Any

from sandman.bench.report import table
from sandman.bench.task_images import build_task_images
from sandman.client import Sandbox, SandmanClient
from sandman.contract import LABEL_BENCH, LABEL_NODE_KIND
from sandman.fleet.fleet import Fleet, FleetConfig, Problem
from sandman.fleet.plot import timeline_png
from sandman.fleet.records import RunData
from sandman.fleet.report import compare_text, summarize
from sandman.fleet.strategies import STRATEGIES
from sandman.harness.cluster.config import KwokNodeShape
from sandman.harness.cluster.kwok_nodes import KWOK_TOLERATION, kwok_node
from sandman.harness.testing import bench_bed
from sandman.kube_async import NAMESPACES, NODES, ApiError
from sandman.pools.manager import ManagerConfig

REAL = {LABEL_NODE_KIND: "real"}
BENCH_LABEL = {LABEL_BENCH: "rollout"}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--problems", type=int, default=20)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--window", type=int, default=4, help="problems per window")
    p.add_argument("--k", type=int, default=2, help="sandboxes per problem with reuse")
    p.add_argument("--max-reuses", type=int, default=8)
    p.add_argument("--layer-mb", type=float, default=4.0, help="unique layer per image")
    p.add_argument("--create-rate", type=float, default=20.0, help="pod creates/s, all pools")
    p.add_argument("--kwok-problems", type=int, default=100)
    p.add_argument("--kwok-rollouts", type=int, default=8)
    p.add_argument("--kwok-concurrency", type=int, default=64)
    p.add_argument("--kwok-task-s", type=float, default=2.0)
    p.add_argument("--kwok-reset-s", type=float, default=0.2)
    p.add_argument("--kwok-nodes", type=int, default=4)
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--skip-real", action="store_true")
    p.add_argument("--skip-kwok", action="store_true")
    p.add_argument("--png", type=Path, default=None, help="timeline plot (one panel per run)")


async def real_task(sb: Sandbox, problem: Problem, rollout: int) -> float:
    """A few commands; reward 1 only if the sandbox was pristine (no trace of
    an earlier rollout), so a reset that leaks state shows up as reward 0."""
    first = await sb.exec("test ! -e /tmp/mark && cat /problem")
    await sb.write_file("/tmp/mark", f"{problem.id}/{rollout}")
    await sb.start(["sleep", "300"])  # left behind on purpose: reset must end it
    total = await sb.exec("seq 1 100 | awk '{s+=$1} END {print s}'")
    ok = first.exit_code == 0 and total.stdout.strip() == "5050"
    return 1.0 if ok else 0.0


def kwok_task(seconds: float):  # type: ignore[no-untyped-def]
    async def task(sb: Sandbox, problem: Problem, rollout: int) -> float:
        await asyncio.sleep(seconds)
        return 1.0

    return task


def kwok_reset(seconds: float):  # type: ignore[no-untyped-def]
    async def reset(sb: Sandbox) -> dict[str, Any]:
        await asyncio.sleep(seconds)
        return {"clean": True}

    return reset


async def _runs(
    client: SandmanClient,
    strategies: list[str],
    make_problems: Any,
    rollouts: int,
    base: dict[str, Any],
    task: Any,
    reset: Any = None,
) -> list[RunData]:
    out = []
    for strategy in strategies:
        for reuse in (False, True):
            cfg = FleetConfig(strategy=strategy, reuse=reuse, **base)
            problems = make_problems()
            data = await Fleet(client, cfg, reset_fn=reset).run(problems, rollouts, task)
            s = summarize(data)
            print(
                f"  {strategy:<9} reuse={'on ' if reuse else 'off'} wall {s['wall_s']:.1f}s "
                f"pods {s['pods_created']} valid {s['results_valid']}/{s['results_expected']}",
                flush=True,
            )
            out.append(data)
            await asyncio.sleep(2)  # let deletions of the previous run drain
    return out


def headline(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    by = {(s["strategy"], s["reuse"]): s for s in summaries}

    def ratio(a: Any, b: Any) -> float | None:
        return round(a / b, 3) if a and b else None

    out: dict[str, Any] = {}
    base = by.get(("none", False))
    warm = by.get(("pipelined", False)) or by.get(("sliding", False))
    if base and warm:
        out["wall_ratio"] = ratio(base["wall_s"], warm["wall_s"])  # none / warm pools
        out["ttfc_p50_ms_warm"] = warm["ttfc_ms"]["p50"]
        out["ttfc_p99_ms_warm"] = warm["ttfc_ms"]["p99"]
        out["ttfc_p50_ms_cold"] = base["ttfc_ms"]["p50"]
        out["ttfc_p99_ms_cold"] = base["ttfc_ms"]["p99"]
    best_reuse = by.get(("pipelined", True)) or by.get(("none", True))
    if base and best_reuse:
        out["wall_ratio_reuse"] = ratio(base["wall_s"], best_reuse["wall_s"])
    per = {}
    for strategy in {s["strategy"] for s in summaries}:
        off, on = by.get((strategy, False)), by.get((strategy, True))
        if off and on:
            per[strategy] = ratio(off["pods_created"], on["pods_created"])
    out["pods_created_ratio_by_strategy"] = per
    if per:
        out["pods_created_ratio"] = per.get("pipelined") or next(iter(per.values()))
    out["infra_failures"] = sum(s["infra_failures"] for s in summaries)
    out["all_rewards_valid"] = all(s["results_ok"] == s["results_expected"] for s in summaries)
    return out


async def _main(args: argparse.Namespace, kubeconfig: Path, registry: str | None) -> dict[str, Any]:
    strategies = args.strategies.split(",")
    results: dict[str, Any] = {}
    all_data: list[RunData] = []
    pools = ManagerConfig(create_rate=args.create_rate, create_burst=int(args.create_rate))
    ns = f"bench-rollout-{secrets.token_hex(3)}"
    async with SandmanClient(kubeconfig=kubeconfig, namespace=ns) as client:
        await client.kube.create(NAMESPACES, {"metadata": {"name": ns}})
        nodes: list[str] = []
        try:
            if not args.skip_real and registry is not None:
                print(f"real node: {args.problems} x {args.rollouts} at {args.concurrency}")
                counter = iter(range(10**6))

                def real_problems() -> list[Problem]:
                    run = f"{ns[-6:]}-{next(counter)}"
                    tags = [f"{run}-{i}" for i in range(args.problems)]
                    refs = build_task_images(registry, tags, layer_mb=args.layer_mb)
                    return [Problem(f"p{i}", ref) for i, ref in enumerate(refs)]

                base = dict(
                    concurrency=args.concurrency,
                    window=args.window,
                    k=args.k,
                    max_reuses=args.max_reuses,
                    command=["sleep", "infinity"],
                    node_selector=REAL,
                    pools=pools,
                )
                data = await _runs(
                    client, strategies, real_problems, args.rollouts, base, real_task
                )
                sums = [summarize(d) for d in data]
                results["real"] = {**headline(sums), "runs": sums}
                all_data += data
                print(compare_text(sums))
            if not args.skip_kwok:
                print(
                    f"kwok: {args.kwok_problems} x {args.kwok_rollouts} at {args.kwok_concurrency}"
                )
                shape = KwokNodeShape(pods=1000)
                for i in range(args.kwok_nodes):
                    name = f"rollout-{ns[-6:]}-{i}"
                    await client.kube.create(NODES, kwok_node(name, shape, labels=BENCH_LABEL))
                    nodes.append(name)
                problems = [
                    Problem(f"k{i}", f"127.0.0.1:5000/sandman/task:kwok-{i}")
                    for i in range(args.kwok_problems)
                ]
                base = dict(
                    concurrency=args.kwok_concurrency,
                    window=max(1, args.kwok_concurrency // args.kwok_rollouts),
                    k=args.k,
                    max_reuses=args.max_reuses,
                    command=["sleep", "infinity"],
                    node_selector=BENCH_LABEL,
                    tolerations=[KWOK_TOLERATION],
                    pools=pools,
                )
                data = await _runs(
                    client,
                    strategies,
                    lambda: problems,
                    args.kwok_rollouts,
                    base,
                    kwok_task(args.kwok_task_s),
                    kwok_reset(args.kwok_reset_s),
                )
                sums = [summarize(d) for d in data]
                results["kwok"] = {**headline(sums), "runs": sums}
                all_data += data
                print(compare_text(sums))
        finally:
            for name in nodes:
                with contextlib.suppress(ApiError):
                    await client.kube.delete(NODES, name)
            await client.kube.delete(NAMESPACES, ns)
    if args.png and all_data:
        timeline_png(all_data, args.png)
        print(f"timeline: {args.png}")
    top = results.get("real") or results.get("kwok") or {}
    for key in ("pods_created_ratio", "wall_ratio", "ttfc_p50_ms_warm", "ttfc_p99_ms_warm"):
        results[key] = top.get(key)
    return results


def run(args: argparse.Namespace) -> dict[str, Any]:
    bed = bench_bed(need_real_node=not args.skip_real)
    try:
        cluster = bed.cluster
        node = cluster.real_node
        registry = node.registry.host if node is not None else None
        results = asyncio.run(_main(args, cluster.kubeconfig, registry))
    finally:
        bed.close()
    rows = []
    for scenario in ("real", "kwok"):
        for k, v in (results.get(scenario) or {}).items():
            if k != "runs":
                rows.append((f"{scenario}.{k}", v))
    print(table("rollout", rows))
    return results
