"""RL batch strategies side by side: none/naive/sliding/pipelined, reuse off and on,
with and without image pulls that take seconds, and with pre-pulling.

Every run is timed from before any warming. Scenarios (each can be skipped):

- real: P problems x R rollouts at concurrency C on the real node, one small
  image per problem (fresh tags per run, so each run pulls from the local
  registry at memory speed), a task of a few commands whose reward is 1 only
  if it found the sandbox pristine.
- real-pull: the same task with a few multi-hundred-MB images pulled through
  a rate-limited proxy (harness/cluster/pullproxy.py); the images are removed
  from the node before every run, so every run pulls them all.
- kwok: the design's 100 x 8 at concurrency 64 on simulated nodes with the
  real control plane (creations, claims, scheduling and readiness are real;
  a kwok pod runs no daemon, so the task and the reset are timed waits).
- kwok-pull: the same on kwok nodes whose pods wait for a modelled pull
  (harness/cluster/kwok_pull.py): size / rate when the node lacks the image.

Variants: every strategy with reuse off and on, plus ``--prepull`` variants
(pre-pull the next problems' images, sandman/fleet/prepull.py) where pulls
cost time. Headline keys compare against the `none` baseline of the same
scenario; ``warm_claim_first_command_p50_ms``/``_p99_ms`` are over every
warm claim (a Ready pool pod) of the real-node scenarios: request -> first
command's result, the exec included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandman.bench.delivery import deliveries, delivery_policy, wait_delivery
from sandman.bench.report import table
from sandman.bench.task_images import build_task_images
from sandman.client import Sandbox, SandmanClient
from sandman.contract import LABEL_BENCH, LABEL_NODE_KIND
from sandman.fleet.fleet import Fleet, FleetConfig, Problem
from sandman.fleet.plot import timeline_png
from sandman.fleet.prepull import Where
from sandman.fleet.records import RunData
from sandman.fleet.report import compare_text, summarize
from sandman.fleet.strategies import STRATEGIES
from sandman.harness.cluster.config import KwokNodeShape
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, KWOK_TOLERATION, kwok_node
from sandman.harness.cluster.kwok_pull import PullNodes
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.pullmodel import PullModel
from sandman.harness.cluster.pullproxy import throttled_pulls
from sandman.harness.testing import bench_bed, free_port
from sandman.kube_async import NAMESPACES, NODES, ApiError
from sandman.pools.manager import ManagerConfig
from sandman.stats import percentile

REAL = {LABEL_NODE_KIND: "real"}
MB = 1_000_000


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--problems", type=int, default=20)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--window", type=int, default=4, help="problems per window")
    p.add_argument("--k", type=int, default=2, help="sandboxes per problem with reuse")
    p.add_argument("--max-reuses", type=int, default=8)
    p.add_argument("--layer-mb", type=float, default=4.0, help="unique layer per image")
    p.add_argument("--create-rate", type=float, default=20.0, help="pod creates/s, all pools")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--reuse", default="off,on", help="reuse modes to run: off,on")
    p.add_argument(
        "--prepull",
        type=int,
        default=4,
        help="problems ahead to pre-pull in the +prepull variants (0: no such variants)",
    )
    p.add_argument(
        "--prepull-strategies",
        default="none,pipelined",
        help="strategies that also run with pre-pulling, where pulls cost time",
    )
    # real node, large images behind a rate limit
    p.add_argument("--pull-problems", type=int, default=8)
    p.add_argument("--pull-window", type=int, default=2, help="problems per window (real-pull)")
    p.add_argument("--pull-image-mb", type=float, default=200.0)
    p.add_argument("--pull-rate-mb", type=float, default=25.0, help="MB/s through the proxy")
    # kwok
    p.add_argument("--kwok-problems", type=int, default=100)
    p.add_argument("--kwok-rollouts", type=int, default=8)
    p.add_argument("--kwok-concurrency", type=int, default=64)
    p.add_argument("--kwok-task-s", type=float, default=2.0)
    p.add_argument("--kwok-reset-s", type=float, default=0.2)
    p.add_argument("--kwok-nodes", type=int, default=4)
    p.add_argument("--kwok-pull-nodes", type=int, default=16)
    p.add_argument("--kwok-image-mb", type=float, default=250.0)
    p.add_argument("--kwok-pull-rate-mb", type=float, default=50.0, help="MB/s per node")
    p.add_argument(
        "--scenarios",
        default="real,real-pull,kwok,kwok-pull",
        help="which of real, real-pull, kwok, kwok-pull to run",
    )
    p.add_argument("--skip-real", action="store_true", help="no real-node scenario")
    p.add_argument("--skip-kwok", action="store_true", help="no kwok scenario")
    p.add_argument("--png", type=Path, default=None, help="timeline plot (one panel per run)")
    p.add_argument(
        "--delivery",
        default="copy",
        help="the daemon's delivery in the bench's namespace: copy (the default install's), "
        "shared or node (a policy rule of the bench's own, for the run)",
    )


@dataclass(frozen=True)
class Variant:
    strategy: str
    reuse: bool
    prepull: int = 0


def variants(args: argparse.Namespace, *, pulls: bool) -> list[Variant]:
    reuse_modes = [m == "on" for m in args.reuse.split(",")]
    out = [Variant(s, r) for s in args.strategies.split(",") for r in reuse_modes]
    if pulls and args.prepull > 0:
        out += [
            Variant(s, r, args.prepull)
            for s in args.prepull_strategies.split(",")
            if s
            for r in reuse_modes
        ]
    return out


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


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def _runs(
    client: SandmanClient,
    runs: list[Variant],
    make_problems: Callable[[], list[Problem]],
    rollouts: int,
    base: dict[str, Any],
    task: Any,
    reset: Any = None,
    before: Callable[[list[Problem]], None] | None = None,
) -> list[RunData]:
    out = []
    for v in runs:
        cfg = FleetConfig(strategy=v.strategy, reuse=v.reuse, prepull_ahead=v.prepull, **base)
        problems = make_problems()
        if before is not None:
            await asyncio.to_thread(before, problems)
        load_before = loadavg()
        data = await Fleet(client, cfg, reset_fn=reset).run(problems, rollouts, task)
        data.params.update(prepull_ahead=v.prepull, load_before=load_before, load_after=loadavg())
        s = summarize(data)
        print(
            f"  {v.strategy:<9} reuse={'on ' if v.reuse else 'off'} prepull={v.prepull} "
            f"wall {s['wall_s']:.1f}s pods {s['pods_created']} "
            f"ttfc p50 {s['ttfc_ms']['p50']} warm p50 {s['warm_claim_ms']['p50']} "
            f"valid {s['results_valid']}/{s['results_expected']} load {load_before[0]}",
            flush=True,
        )
        out.append(data)
        await asyncio.sleep(2)  # let deletions of the previous run drain
    return out


def _warm_claims_ms(data: Sequence[RunData]) -> list[float]:
    return [
        t * 1000
        for d in data
        for r in d.records
        if r.final is not None and r.final.warm and (t := r.ttfc_s) is not None
    ]


def headline(summaries: list[dict[str, Any]], data: Sequence[RunData] = ()) -> dict[str, Any]:
    def key(s: dict[str, Any]) -> tuple[str, bool, int]:
        return s["strategy"], s["reuse"], int(s["params"].get("prepull_ahead") or 0)

    by = {key(s): s for s in summaries}

    def ratio(a: Any, b: Any) -> float | None:
        return round(a / b, 3) if a and b else None

    out: dict[str, Any] = {}
    base = by.get(("none", False, 0))
    warm = by.get(("pipelined", False, 0)) or by.get(("sliding", False, 0))
    if base and warm:
        out["wall_ratio"] = ratio(base["wall_s"], warm["wall_s"])  # none / warm pools
        out["ttfc_p50_ms_warm"] = warm["ttfc_ms"]["p50"]
        out["ttfc_p99_ms_warm"] = warm["ttfc_ms"]["p99"]
        out["ttfc_p50_ms_cold"] = base["ttfc_ms"]["p50"]
        out["ttfc_p99_ms_cold"] = base["ttfc_ms"]["p99"]
    best_reuse = by.get(("pipelined", True, 0)) or by.get(("none", True, 0))
    if base and best_reuse:
        out["wall_ratio_reuse"] = ratio(base["wall_s"], best_reuse["wall_s"])
    per = {}
    for strategy in {s["strategy"] for s in summaries}:
        off, on = by.get((strategy, False, 0)), by.get((strategy, True, 0))
        if off and on:
            per[strategy] = ratio(off["pods_created"], on["pods_created"])
    out["pods_created_ratio_by_strategy"] = per
    if per:
        out["pods_created_ratio"] = per.get("pipelined") or next(iter(per.values()))
    for reuse in (False, True):
        done = [s for s in summaries if s["reuse"] == reuse and s["wall_s"]]
        if done:
            best = min(done, key=lambda s: s["wall_s"])
            label = best["strategy"] + ("+prepull" if key(best)[2] else "")
            out["fastest_reuse" if reuse else "fastest"] = label
    warm_ms = _warm_claims_ms(data)
    out["warm_claims"] = len(warm_ms)
    out["warm_claim_first_command_p50_ms"] = _r(percentile(warm_ms, 50))
    out["warm_claim_first_command_p99_ms"] = _r(percentile(warm_ms, 99))
    out["infra_failures"] = sum(s["infra_failures"] for s in summaries)
    out["all_rewards_valid"] = all(s["results_ok"] == s["results_expected"] for s in summaries)
    return out


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


@dataclass
class Bed:
    """What the scenarios need from the cluster (resolved before the event loop)."""

    kubeconfig: Path
    registry: str | None
    extender_url: str | None
    cluster: LocalCluster
    work_dir: Path


def extender_url(cluster: LocalCluster) -> str | None:
    """Where the host reaches sandman-scheduler's extender (for ``/v1/images``)."""
    mode = cluster.config.sandman_mode
    if mode == "host":
        return f"http://127.0.0.1:{cluster.config.ports.extender}"
    dep = cluster.deployment
    if mode == "in-cluster" and dep is not None:
        urls = dep.metrics_urls("extender")
        return urls[0].removesuffix("/metrics") if urls else None
    return None


async def _scenario(
    name: str,
    results: dict[str, Any],
    all_data: list[RunData],
    coro: Any,
) -> None:
    print(f"{name}:", flush=True)
    data = await coro
    sums = [summarize(d) for d in data]
    results[name] = {**headline(sums, data), "runs": sums}
    all_data += data
    print(compare_text(sums), flush=True)


async def _main(args: argparse.Namespace, bed: Bed, ns_labels: dict[str, str]) -> dict[str, Any]:
    scenarios = set(args.scenarios.split(","))
    if args.skip_real:
        scenarios -= {"real", "real-pull"}
    if args.skip_kwok:
        scenarios -= {"kwok", "kwok-pull"}
    results: dict[str, Any] = {"load_start": loadavg(), "delivery": args.delivery}
    all_data: list[RunData] = []
    pools = ManagerConfig(create_rate=args.create_rate, create_burst=int(args.create_rate))
    ns = f"bench-rollout-{secrets.token_hex(3)}"
    tag = ns[-6:]
    async with SandmanClient(kubeconfig=bed.kubeconfig, namespace=ns) as client:
        await client.kube.create(NAMESPACES, {"metadata": {"name": ns, "labels": ns_labels}})
        try:
            if ns_labels:
                await wait_delivery(client, KWOK_IMAGE, args.delivery)
            real_base = dict(
                concurrency=args.concurrency,
                window=args.window,
                k=args.k,
                max_reuses=args.max_reuses,
                command=["sleep", "infinity"],
                node_selector=REAL,
                pools=pools,
                extender_url=bed.extender_url,
            )
            if "real" in scenarios and bed.registry is not None:
                counter = iter(range(10**6))
                registry = bed.registry

                def real_problems() -> list[Problem]:
                    run = f"{tag}-{next(counter)}"
                    tags = [f"{run}-{i}" for i in range(args.problems)]
                    refs = build_task_images(registry, tags, layer_mb=args.layer_mb)
                    return [Problem(f"p{i}", ref) for i, ref in enumerate(refs)]

                async def real_runs() -> list[RunData]:
                    data = await _runs(
                        client,
                        variants(args, pulls=False),
                        real_problems,
                        args.rollouts,
                        real_base,
                        real_task,
                    )
                    return _tagged(data, "real")

                await _scenario("real", results, all_data, real_runs())
            if "real-pull" in scenarios and bed.registry is not None:
                await _real_pull(args, bed, client, real_base, results, all_data, tag)
            kwok_base = dict(
                concurrency=args.kwok_concurrency,
                window=max(1, args.kwok_concurrency // args.kwok_rollouts),
                k=args.k,
                max_reuses=args.max_reuses,
                command=["sleep", "infinity"],
                tolerations=[KWOK_TOLERATION],
                pools=pools,
                extender_url=bed.extender_url,
            )
            if "kwok" in scenarios:
                await _kwok(args, client, kwok_base, results, all_data, tag)
            if "kwok-pull" in scenarios:
                await _kwok_pull(args, bed, client, kwok_base, results, all_data, tag)
        finally:
            await client.kube.delete(NAMESPACES, ns)
    if args.png and all_data:
        timeline_png(all_data, args.png)
        print(f"timeline: {args.png}")
    top = results.get("real") or results.get("kwok") or {}
    for k in ("pods_created_ratio", "wall_ratio", "ttfc_p50_ms_warm", "ttfc_p99_ms_warm"):
        results[k] = top.get(k)
    real_data = [d for d in all_data if d.params.get("scenario", "").startswith("real")]
    warm_ms = _warm_claims_ms(real_data)
    results["warm_claims"] = len(warm_ms)
    results["warm_claim_first_command_p50_ms"] = _r(percentile(warm_ms, 50))
    results["warm_claim_first_command_p99_ms"] = _r(percentile(warm_ms, 99))
    results["load_end"] = loadavg()
    return results


def wait_unheld(extender_url: str, images: Sequence[str], timeout_s: float) -> list[str]:
    """Until the extender says no node holds or pulls ``images``; those it
    still places when ``timeout_s`` ends."""
    deadline = time.monotonic() + timeout_s
    left = list(images)
    while left and time.monotonic() < deadline:
        still = []
        for image in left:
            try:
                with urllib.request.urlopen(Where.url(extender_url, image), timeout=5) as r:
                    where = Where.from_answer(json.load(r))
            except (OSError, ValueError):
                where = None
            if where is None or where.holders or where.pulling:
                still.append(image)
        left = still
        if left:
            time.sleep(2)
    return left


def _tagged(data: list[RunData], scenario: str) -> list[RunData]:
    for d in data:
        d.params["scenario"] = scenario
    return data


async def _real_pull(
    args: argparse.Namespace,
    bed: Bed,
    client: SandmanClient,
    base: dict[str, Any],
    results: dict[str, Any],
    all_data: list[RunData],
    tag: str,
) -> None:
    assert bed.registry is not None
    node = bed.cluster.real_node
    assert node is not None
    tags = [f"big-{tag}-{i}" for i in range(args.pull_problems)]
    t0 = time.monotonic()
    refs = await asyncio.to_thread(
        build_task_images, bed.registry, tags, layer_mb=args.pull_image_mb
    )
    print(
        f"  built {len(refs)} images of {args.pull_image_mb:.0f} MB in {time.monotonic() - t0:.0f}s"
    )
    problems = [Problem(f"b{i}", ref) for i, ref in enumerate(refs)]

    def forget(_problems: list[Problem]) -> None:
        """Every run starts without the images on the node, and with the
        extender knowing it: its index keeps what the previous run's pods
        showed until the node's own image list refutes it (up to a minute),
        and a pre-pull the extender thinks needless is skipped (the first
        measurement, 20:52, pre-pulled nothing for that reason)."""
        for ref in refs:
            with contextlib.suppress(Exception):
                node.crictl("rmi", ref)
        if bed.extender_url is not None:
            t0 = time.monotonic()
            left = wait_unheld(bed.extender_url, refs, timeout_s=180)
            print(
                f"  images removed; the extender agreed in {time.monotonic() - t0:.0f}s"
                + (f" (still holds {len(left)})" if left else ""),
                flush=True,
            )

    async def runs() -> list[RunData]:
        with throttled_pulls(
            node.lay.registry_hosts_dir,
            bed.registry or "",
            free_port(),
            args.pull_rate_mb * MB,
            bed.work_dir,
        ):
            data = await _runs(
                client,
                variants(args, pulls=True),
                lambda: problems,
                args.rollouts,
                {**base, "window": args.pull_window},
                real_task,
                before=forget,
            )
        forget(problems)
        return _tagged(data, "real-pull")

    await _scenario("real-pull", results, all_data, runs())
    results["real-pull"]["image_mb"] = args.pull_image_mb
    results["real-pull"]["pull_rate_mb_s"] = args.pull_rate_mb


async def _kwok(
    args: argparse.Namespace,
    client: SandmanClient,
    base: dict[str, Any],
    results: dict[str, Any],
    all_data: list[RunData],
    tag: str,
) -> None:
    label = {LABEL_BENCH: "rollout"}
    nodes: list[str] = []
    shape = KwokNodeShape(pods=1000)
    try:
        for i in range(args.kwok_nodes):
            name = f"rollout-{tag}-{i}"
            await client.kube.create(NODES, kwok_node(name, shape, labels=label))
            nodes.append(name)
        problems = [
            Problem(f"k{i}", f"127.0.0.1:5000/sandman/task:kwok-{i}")
            for i in range(args.kwok_problems)
        ]

        async def runs() -> list[RunData]:
            data = await _runs(
                client,
                variants(args, pulls=False),
                lambda: problems,
                args.kwok_rollouts,
                {**base, "node_selector": label},
                kwok_task(args.kwok_task_s),
                kwok_reset(args.kwok_reset_s),
            )
            return _tagged(data, "kwok")

        await _scenario("kwok", results, all_data, runs())
    finally:
        for name in nodes:
            with contextlib.suppress(ApiError):
                await client.kube.delete(NODES, name)


async def _kwok_pull(
    args: argparse.Namespace,
    bed: Bed,
    client: SandmanClient,
    base: dict[str, Any],
    results: dict[str, Any],
    all_data: list[RunData],
    tag: str,
) -> None:
    label = {LABEL_BENCH: "rollout-pull"}
    model = PullModel(rate_bytes_per_s=args.kwok_pull_rate_mb * MB)
    size = int(args.kwok_image_mb * MB)
    counter = iter(range(10**6))

    def problems() -> list[Problem]:
        """Fresh image names per run: no node holds them (nor does the extender think so)."""
        run = next(counter)
        out = [
            Problem(f"k{i}", f"127.0.0.1:5000/sandman/task:kwok-{tag}-{run}-{i}")
            for i in range(args.kwok_problems)
        ]
        model.sizes.update({p.image: size for p in out})
        return out

    cluster = bed.cluster
    async with PullNodes(
        client.kube,
        kwok=cluster.binaries.kwok,
        kubeconfig=cluster.layout.kubeconfig("kwok"),
        work_dir=bed.work_dir,
        port=free_port(),
        names=[f"rollout-pull-{tag}-{i}" for i in range(args.kwok_pull_nodes)],
        model=model,
        clock=time.time,
        shape=KwokNodeShape(pods=1000),
        labels=label,
    ):

        async def runs() -> list[RunData]:
            data = await _runs(
                client,
                variants(args, pulls=True),
                problems,
                args.kwok_rollouts,
                {**base, "node_selector": label},
                kwok_task(args.kwok_task_s),
                kwok_reset(args.kwok_reset_s),
            )
            return _tagged(data, "kwok-pull")

        await _scenario("kwok-pull", results, all_data, runs())
    results["kwok-pull"]["image_mb"] = args.kwok_image_mb
    results["kwok-pull"]["pull_rate_mb_s"] = args.kwok_pull_rate_mb
    results["kwok-pull"]["nodes"] = args.kwok_pull_nodes


def run(args: argparse.Namespace) -> dict[str, Any]:
    if len(deliveries(args.delivery)) != 1:
        raise SystemExit("--delivery: one delivery per rollout run")
    scenarios = set(args.scenarios.split(","))
    need_real = not args.skip_real and bool(scenarios & {"real", "real-pull"})
    bed = bench_bed(need_real_node=need_real)
    try:
        cluster = bed.cluster
        node = cluster.real_node
        work = cluster.config.state_dir / "bench-rollout"
        b = Bed(
            cluster.kubeconfig,
            node.registry.host if node is not None else None,
            extender_url(cluster),
            cluster,
            work,
        )
        print(f"extender: {b.extender_url}; load {loadavg()}", flush=True)
        with delivery_policy(cluster, args.delivery) as ns_labels:
            results = asyncio.run(_main(args, b, ns_labels))
    finally:
        bed.close()
    rows = []
    for scenario in ("real", "real-pull", "kwok", "kwok-pull"):
        for k, v in (results.get(scenario) or {}).items():
            if k != "runs":
                rows.append((f"{scenario}.{k}", v))
    print(table("rollout", rows))
    return results
