"""`sandman bench peer`: Sandman and agent-sandbox side by side, in one run on one cluster.

Builds the peer's controller (kubernetes-sigs/agent-sandbox) from
``--peer-src``, installs its CRDs, runs it with its extensions beside
Sandman on one local cluster (the real node and kwok nodes), and runs the
same workloads through both, round by round, same image, command and node:
cold starts (1 and 16 at once, and the peer's sandbox with Sandman's label),
warm claims (1, 8 and 32 at once), bursts on kwok nodes (claims and cold
creates), what a lifecycle costs the control plane, and an RL batch. Every
row has ``ours_*``, ``peer_*`` and ``ratio_*`` keys; a ratio above 1 means
ours is better.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import os
import random
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from sandman.bench.delivery import deliveries, delivery_policy, wait_delivery
from sandman.bench.peer import controller as peer_ctl
from sandman.bench.peer import objects as peer
from sandman.bench.peer.compare import Row, json_keys, verdicts
from sandman.bench.peer.cost import (
    Ledger,
    apiserver_counts,
    counts_delta,
    cpu_by_role,
    cpu_delta,
    etcd_usage,
)
from sandman.bench.peer.exec_api import ApiExec
from sandman.bench.peer.rl import ours_rl, peer_rl
from sandman.bench.peer.rows import (
    CLAIM_TTL,
    COMMAND,
    OUR_POOL,
    PEER_POOL,
    Sample,
    Side,
    clear,
    drop_pools,
    make_pools,
    ours_claim,
    ours_cold,
    peer_claim,
    peer_cold,
    peer_template,
    pools_full,
    settle,
    summary,
)
from sandman.bench.peer.watch import ReadyLog
from sandman.client import SandmanClient, startup
from sandman.client.sandbox import build_pod
from sandman.contract import LABEL_BENCH, LABEL_NODE_KIND
from sandman.harness.cluster.config import KwokNodeShape
from sandman.harness.cluster.kwok_nodes import KWOK_TOLERATION, kwok_node
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.testing import real_node_bench
from sandman.kube_async import NAMESPACES, NODES, PODS, ApiError, KubeClient
from sandman.pools.claim import claim

REAL = {LABEL_NODE_KIND: "real"}
REPO_ROOT = Path(__file__).resolve().parents[2]


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--peer-src",
        type=Path,
        default=None,
        help="the agent-sandbox source tree to build (default: ../shared/peers/agent-sandbox "
        "beside this checkout, when present)",
    )
    p.add_argument("--image", default="tiny", help="image recipe both systems run")
    p.add_argument(
        "--deliveries",
        default="copy",
        help="the daemon's deliveries the cold rows run with, the first for every row "
        "(copy: the default install's; shared, node: the other install options); each "
        "further one adds cold_<delivery>_* rows",
    )
    p.add_argument("--rows", default="cold,composed,warm,burst,rl", help="rows to run")
    p.add_argument("--cold-rounds-1", type=int, default=10, help="rounds of one cold start")
    p.add_argument("--cold-rounds-16", type=int, default=3, help="rounds of 16 cold starts")
    p.add_argument("--warm-levels", default="1,8,32", help="claims at once")
    p.add_argument("--warm-rounds", default="10,3,2", help="rounds at each level")
    p.add_argument("--burst", type=int, default=1000, help="claims (and cold creates) in a burst")
    p.add_argument("--kwok-nodes", type=int, default=10, help="kwok nodes for the bursts")
    p.add_argument("--rl-problems", type=int, default=100)
    p.add_argument("--rl-rollouts", type=int, default=8)
    p.add_argument("--rl-concurrency", type=int, default=64)
    p.add_argument("--rl-layer-mb", type=float, default=0.5, help="unique layer per RL image")


def run(args: argparse.Namespace) -> dict[str, Any]:
    src = args.peer_src or peer_ctl.default_source(REPO_ROOT)
    if src is None:
        raise SystemExit(
            "sandman bench peer: no agent-sandbox source found beside this checkout; "
            "pass --peer-src PATH (a kubernetes-sigs/agent-sandbox checkout)"
        )
    _deliveries(args)  # a bad --deliveries fails before any cluster comes up
    try:
        peer_ctl.check_source(src)
    except peer_ctl.PeerError as e:
        raise SystemExit(f"sandman bench peer: {e}") from None
    with real_node_bench(args.image) as (cluster, node, ref):
        try:
            binary = peer_ctl.build(src, cluster.config.cache_dir)
        except peer_ctl.PeerError as e:
            raise SystemExit(f"sandman bench peer: {e}") from None
        log = Path(tempfile.mkdtemp(prefix="bench-peer-")) / "agent-sandbox-controller.log"
        delivery = _deliveries(args)[0]
        with delivery_policy(cluster, delivery) as labels:
            results = asyncio.run(
                _main(args, cluster, node.registry.host, ref, src, binary, log, labels)
            )
        results["delivery"] = delivery
    results["image"] = ref
    results["peer_source"] = str(src)
    print(_table(results))
    return results


def clusters_running() -> int:
    """Control planes on this machine (etcd processes), as `quiet` counts them."""
    n = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if (d / "comm").read_text().strip() == "etcd":
                    n += 1
    return n


def _mark() -> dict[str, Any]:
    return {"load1": round(os.getloadavg()[0], 2), "clusters": clusters_running()}


async def _row(name: str, marks: dict[str, Any], coro: Callable[[], Awaitable[Any]]) -> Any:
    start = _mark()
    print(f"== {name} (load {start['load1']}, {start['clusters']} cluster(s))", flush=True)
    t = time.monotonic()
    error = None
    try:
        out = await coro()
    except Exception as e:  # one row failing still leaves the others' figures
        error = _why(e)
        print(f"== {name} failed: {error}", flush=True)
        out = []
    end = _mark()
    marks[name] = {"start": start, "end": end, "seconds": round(time.monotonic() - t, 1)}
    if error:
        marks[name]["error"] = error
    return out


def _resolver(cluster: LocalCluster, peer_pid: int) -> Callable[[], dict[str, list[int]]]:
    from sandman.bench.scale_chaos import IN_CLUSTER, component_pods
    from sandman.bench.scale_metrics import cmdline, pids_of_pod

    host = {
        "etcd": "etcd",
        "kube-apiserver": "apiserver",
        "kube-controller-manager": "controller-manager",
        "kube-scheduler": "scheduler",
        "sandman-webhook": "sandman",
        "sandman-extender": "sandman",
        "sandman-scheduler": "sandman",
        "sandman-reaper": "sandman",
    }
    procs = cluster.processes()

    def resolve() -> dict[str, list[int]]:
        out: dict[str, list[int]] = {"peer-controller": [peer_pid]}
        for p in procs:
            role = host.get(p.name)
            pid = p.running_pid()
            if role and pid is not None:
                out.setdefault(role, []).append(pid)
        if cluster.config.sandman_mode == "in-cluster":
            for comp, (app, needle) in IN_CLUSTER.items():
                role = "scheduler" if comp == "scheduler" else "sandman"
                for pod in component_pods(cluster, app):
                    for pid in pids_of_pod(pod["metadata"]["uid"]):
                        if needle in cmdline(pid):
                            out.setdefault(role, []).append(pid)
        return out

    return resolve


@contextlib.asynccontextmanager
async def _side(
    client: SandmanClient, image: str, api_exec: ApiExec, observer: KubeClient
) -> AsyncIterator[Side]:
    """The workloads' view of the client's namespace on the real node, with the
    watches that time its pods', sandboxes' and claims' Ready."""
    kube, ns = client.kube, client.namespace
    async with (
        ReadyLog(kube, PODS, ns, startup.ready) as pods,
        ReadyLog(kube, peer.SANDBOXES, ns, peer.is_ready) as sandboxes,
        ReadyLog(kube, peer.CLAIMS, ns, peer.is_ready) as claims,
    ):
        yield Side(
            kube, client, ns, image, REAL, [], pods, sandboxes, claims, api_exec, observer
        )  # fmt: skip


async def _main(
    args: argparse.Namespace,
    cluster: LocalCluster,
    registry: str,
    image: str,
    src: Path,
    binary: Path,
    log: Path,
    ns_labels: dict[str, str],
) -> dict[str, Any]:
    ns = f"bench-peer-{secrets.token_hex(3)}"
    wanted = set(args.rows.split(","))
    marks: dict[str, Any] = {}
    rows: list[Row] = []
    extra: dict[str, Any] = {"rows_run": sorted(wanted)}
    async with SandmanClient(
        kubeconfig=cluster.kubeconfig, namespace=ns, transport="direct"
    ) as client:
        kube = client.kube
        meta = {"name": ns, "labels": {LABEL_BENCH: "peer", **ns_labels}}
        await kube.create(NAMESPACES, {"metadata": meta})
        if ns_labels:
            await wait_delivery(client, image, _deliveries(args)[0])
        crds = await peer_ctl.install_crds(kube, src)
        kwok: list[str] = []
        api_exec = ApiExec(cluster.kubeconfig)
        observer = KubeClient.from_kubeconfig(cluster.kubeconfig, user_agent="bench-observer")
        await observer.__aenter__()
        try:
            with peer_ctl.running(binary, cluster.kubeconfig, log) as proc:
                print(f"the peer's controller runs (pid {proc.pid}, log {log})", flush=True)
                resolve = _resolver(cluster, proc.pid)
                async with _side(client, image, api_exec, observer) as side:
                    if "cold" in wanted:
                        rows += await _row(
                            "cold", marks, lambda: _cold(side, args, cluster, resolve, extra)
                        )
                        for d in _deliveries(args)[1:]:
                            rows += await _row(
                                f"cold-{d}",
                                marks,
                                lambda d=d: _cold_delivery(
                                    d, cluster, image, args, api_exec, observer, resolve, extra
                                ),
                            )
                    if "composed" in wanted:
                        rows += await _row("composed", marks, lambda: _composed(side, args))
                    if "warm" in wanted:
                        rows += await _row("warm", marks, lambda: _warm(side, args))
                    if "burst" in wanted:
                        kwok = await _kwok_nodes(kube, args.kwok_nodes, args.burst, ns)
                        # The same watches, sandboxes placed on the kwok nodes.
                        kside = dataclasses.replace(
                            side,
                            node_selector={LABEL_BENCH: f"peer-{ns}"},
                            tolerations=[KWOK_TOLERATION],
                            reserved=set(),
                            rng=random.Random(0),
                        )
                        rows += await _row("burst", marks, lambda: _burst(kside, args, extra))
                    if "rl" in wanted:
                        rows += await _row(
                            "rl", marks, lambda: _rl(side, client, args, registry, ns, extra)
                        )
                    proc.check_alive()
        finally:
            api_exec.close()
            await observer.close()
            with contextlib.suppress(Exception):
                await kube.delete(NAMESPACES, ns)
            with contextlib.suppress(Exception):
                await _wait_namespace_gone(client, ns)
            await peer_ctl.remove_crds(kube, crds)
            for n in kwok:
                with contextlib.suppress(ApiError):
                    await kube.delete(NODES, n)
    out: dict[str, Any] = {**json_keys(rows), **extra, "rows": marks}
    out["targets"] = [{"target": v.target, "met": v.met, "short": v.short} for v in verdicts(rows)]
    out["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    return out


async def _wait_namespace_gone(client: SandmanClient, ns: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            await client.kube.get(NAMESPACES, ns)
        except ApiError as e:
            if e.not_found:
                return
            raise
        await asyncio.sleep(1)


# -- cold ----------------------------------------------------------------------------
async def _cold(
    side: Side,
    args: argparse.Namespace,
    cluster: LocalCluster,
    resolve: Callable[[], dict[str, list[int]]],
    extra: dict[str, Any],
    *,
    prefix: str = "cold",
    lifecycle: str = "lifecycle",
) -> list[Row]:
    out: list[Row] = []
    # A warm-up of each (the namespace's first pod, the image's first start).
    await ours_cold(side)
    await peer_cold(side)
    await clear(side)
    ledgers = {"ours": Ledger(), "peer": Ledger()}
    etcd_port = cluster.config.ports.etcd_client
    for n, rounds_n in ((1, args.cold_rounds_1), (16, args.cold_rounds_16)):
        got: dict[str, list[Sample]] = {"ours": [], "peer": []}
        for r in range(rounds_n):
            order = ["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]
            for name in order:
                make = (lambda: ours_cold(side)) if name == "ours" else (lambda: peer_cold(side))
                samples = await _costed(side, ledgers[name], n, make, resolve, etcd_port)
                got[name] += samples
            print(
                f"{prefix} {n} at once, round {r + 1}/{rounds_n}: "
                + ", ".join(
                    f"{k} ready p50 {summary(v, 'ready_ms')['p50']} ms, first command p50 "
                    f"{summary(v, 'first_ms')['p50']} ms"
                    for k, v in got.items()
                ),
                flush=True,
            )
        out += _latency_rows(f"{prefix}_{n}", got, first_vs_ready=True)
    extra[lifecycle] = {k: v.per_sandbox() for k, v in ledgers.items()}
    o, p = extra[lifecycle]["ours"], extra[lifecycle]["peer"]
    for key, ours_v, peer_v in (
        ("apiserver_requests", o["apiserver_requests"], p["apiserver_requests"]),
        ("apiserver_cpu_s", o["cpu_s"].get("apiserver"), p["cpu_s"].get("apiserver")),
        ("etcd_cpu_s", o["cpu_s"].get("etcd"), p["cpu_s"].get("etcd")),
        ("etcd_objects", o["etcd_objects"], p["etcd_objects"]),
        ("etcd_bytes", o["etcd_bytes"], p["etcd_bytes"]),
        ("controllers_cpu_s", o["cpu_s"].get("sandman"), p["cpu_s"].get("peer-controller")),
    ):
        out.append(Row(f"{lifecycle}_{key}", ours_v, peer_v, "lower"))
    return out


async def _costed(
    side: Side,
    ledger: Ledger,
    n: int,
    make: Callable[[], Awaitable[Sample]],
    resolve: Callable[[], dict[str, list[int]]],
    etcd_port: int,
) -> list[Sample]:
    """``n`` lifecycles at once (create -> Ready -> first command -> delete -> gone),
    their cost added to ``ledger``. The cost is one system's alone: nothing of
    the other is in flight."""
    await settle()
    pids = resolve()
    polls0 = sum(side.observer.requests.values())
    req0 = await apiserver_counts(side.kube)
    cpu0 = cpu_by_role(pids)
    objs0, bytes0 = await asyncio.to_thread(etcd_usage, etcd_port)
    samples = list(await asyncio.gather(*(make() for _ in range(n))))
    objs1, bytes1 = await asyncio.to_thread(etcd_usage, etcd_port)
    await clear(side)
    cpu1 = cpu_by_role(pids)
    req1 = await apiserver_counts(side.kube)
    ledger.sandboxes += n
    ledger.add_requests(counts_delta(req1, req0))
    # The bench's own lists while it waits for deletions are not the system's
    # cost (they go through the observer client and are subtracted); its
    # creates, gets, watches and deletes are: a user makes them too.
    ledger.bench_polls += sum(side.observer.requests.values()) - polls0
    ledger.add_cpu(cpu_delta(cpu1, cpu0))
    ledger.etcd_objects += max(0, objs1 - objs0)
    ledger.etcd_bytes += max(0, bytes1 - bytes0)
    return samples


def _latency_rows(prefix: str, got: dict[str, list[Sample]], *, first_vs_ready: bool) -> list[Row]:
    o_ready, p_ready = summary(got["ours"], "ready_ms"), summary(got["peer"], "ready_ms")
    o_first, p_first = summary(got["ours"], "first_ms"), summary(got["peer"], "first_ms")
    rows = []
    for q in ("p50", "p99"):
        rows.append(Row(f"{prefix}_ready_{q}_ms", o_ready[q], p_ready[q], "lower"))
        rows.append(Row(f"{prefix}_first_command_{q}_ms", o_first[q], p_first[q], "lower"))
        if first_vs_ready:
            rows.append(
                Row(f"{prefix}_first_command_vs_ready_{q}_ms", o_first[q], p_ready[q], "lower")
            )
    return rows


def _deliveries(args: argparse.Namespace) -> list[str]:
    return deliveries(args.deliveries, "--deliveries")


async def _cold_delivery(
    delivery: str,
    cluster: LocalCluster,
    image: str,
    args: argparse.Namespace,
    api_exec: ApiExec,
    observer: KubeClient,
    resolve: Callable[[], dict[str, list[int]]],
    extra: dict[str, Any],
) -> list[Row]:
    """The cold rows again, ours with another delivery (a namespace of its own
    that the cluster's policy gives that delivery, for the run)."""
    ns = f"bench-peer-{delivery}-{secrets.token_hex(3)}"
    with delivery_policy(cluster, delivery) as labels:
        async with SandmanClient(
            kubeconfig=cluster.kubeconfig, namespace=ns, transport="direct"
        ) as client:
            kube = client.kube
            meta = {"name": ns, "labels": {LABEL_BENCH: "peer", **labels}}
            await kube.create(NAMESPACES, {"metadata": meta})
            try:
                await wait_delivery(client, image, delivery)
                async with _side(client, image, api_exec, observer) as side:
                    return await _cold(
                        side, args, cluster, resolve, extra,
                        prefix=f"cold_{delivery}", lifecycle=f"lifecycle_{delivery}",
                    )  # fmt: skip
            finally:
                with contextlib.suppress(Exception):
                    await kube.delete(NAMESPACES, ns)
                with contextlib.suppress(Exception):
                    await _wait_namespace_gone(client, ns)


# -- composed: the peer's controller making a pod Sandman's webhook injects -----------
async def _composed(side: Side, args: argparse.Namespace) -> list[Row]:
    got: dict[str, list[Sample]] = {"ours": [], "peer": []}
    for r in range(args.cold_rounds_1):
        order = ["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]
        for name in order:
            await settle()
            got[name].append(await peer_cold(side, sandman_label=(name == "ours")))
            await clear(side)
    print(
        "composed: the peer's sandbox with Sandman's label: ready p50 "
        f"{summary(got['ours'], 'ready_ms')['p50']} ms, first command p50 "
        f"{summary(got['ours'], 'first_ms')['p50']} ms; the peer's alone: ready p50 "
        f"{summary(got['peer'], 'ready_ms')['p50']} ms, first command p50 "
        f"{summary(got['peer'], 'first_ms')['p50']} ms",
        flush=True,
    )
    return _latency_rows("composed_1", got, first_vs_ready=False)


# -- warm ----------------------------------------------------------------------------
async def _warm(side: Side, args: argparse.Namespace) -> list[Row]:
    levels = [int(x) for x in args.warm_levels.split(",") if x]
    reps = [int(x) for x in args.warm_rounds.split(",") if x]
    if len(reps) != len(levels):
        raise SystemExit("--warm-rounds: one count per --warm-levels entry")
    size = max(levels)
    await make_pools(side, size)
    out: list[Row] = []
    try:
        for level, rounds_n in zip(levels, reps, strict=True):
            got: dict[str, list[Sample]] = {"ours": [], "peer": []}
            for r in range(rounds_n):
                order = ["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]
                for name in order:
                    candidates = await pools_full(side, size)
                    await settle()
                    if name == "ours":
                        got[name] += await asyncio.gather(
                            *(ours_claim(side, candidates) for _ in range(level))
                        )
                    else:
                        got[name] += await asyncio.gather(*(peer_claim(side) for _ in range(level)))
                    await clear(side)
            print(
                f"warm {level} at once: ours claim -> first command p50 "
                f"{summary(got['ours'], 'first_ms')['p50']} ms p99 "
                f"{summary(got['ours'], 'first_ms')['p99']} ms; peer claim -> Ready p50 "
                f"{summary(got['peer'], 'ready_ms')['p50']} ms p99 "
                f"{summary(got['peer'], 'ready_ms')['p99']} ms, -> first command p50 "
                f"{summary(got['peer'], 'first_ms')['p50']} ms",
                flush=True,
            )
            prefix = f"warm_{level}_claim"
            out += _latency_rows(prefix, got, first_vs_ready=True)
    finally:
        await drop_pools(side)
        await clear(side)
        await _pools_gone(side)
    return out


async def _pools_gone(side: Side, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pods = await side.observer.list(PODS, side.namespace)
        sbs = await side.observer.list(peer.SANDBOXES, side.namespace)
        if not pods["items"] and not sbs["items"]:
            return
        await asyncio.sleep(1)
    raise RuntimeError(f"the warm pools' pods were not gone after {timeout_s}s")


# -- burst on kwok nodes -------------------------------------------------------------
async def _kwok_nodes(kube: Any, count: int, pods_total: int, ns: str) -> list[str]:
    # Room for both pools, their refills and the claimed pods at once.
    per_node = max(110, -(-pods_total * 5 // max(1, count)))
    shape = KwokNodeShape(cpu="1000", memory="4Ti", pods=per_node)
    names = [f"kwok-peer-{ns[-6:]}-{i}" for i in range(count)]
    for n in names:
        await kube.create(NODES, kwok_node(n, shape, labels={LABEL_BENCH: f"peer-{ns}"}))
    deadline = time.monotonic() + 300
    while True:
        items = (await kube.list(NODES, label_selector=f"{LABEL_BENCH}=peer-{ns}"))["items"]
        if sum(peer.is_ready(i) for i in items) >= count:
            return names
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} kwok nodes not Ready in 300 s")
        await asyncio.sleep(0.5)


async def _burst(side: Side, args: argparse.Namespace, extra: dict[str, Any]) -> list[Row]:
    n = args.burst
    rows: list[Row] = []
    doc: dict[str, Any] = {}
    # Claims: a pool of n per system, full, then n claims at the same instant.
    await make_pools(side, n)
    try:
        stats = {}
        for name in ("ours", "peer"):
            candidates = await pools_full(side, n, timeout_s=1200)
            stats[name] = await _burst_claims(side, name, n, candidates)
            print(f"burst of {n} claims, {name}: {stats[name]}", flush=True)
    finally:
        await drop_pools(side)
    await _delete_all(side)
    for name, left in (await _leaks(side)).items():
        stats[name]["leaked"] = left
    # Cold creates: n sandboxes at once, no pool.
    cold = {}
    for name in ("peer", "ours"):
        cold[name] = await _burst_creates(side, name, n)
        print(f"burst of {n} cold creates, {name}: {cold[name]}", flush=True)
        await _delete_all(side)
        cold[name]["leaked"] = (await _leaks(side))[name]
    for kind, st in (("claims", stats), ("creates", cold)):
        o, p = st["ours"], st["peer"]
        rows += [
            Row(f"burst_{kind}_per_s", o["per_s"], p["per_s"], "higher"),
            Row(f"burst_{kind}_ready_p50_ms", o["p50_ms"], p["p50_ms"], "lower"),
            Row(f"burst_{kind}_ready_p99_ms", o["p99_ms"], p["p99_ms"], "lower"),
            Row(f"burst_{kind}_lost", o["lost"], p["lost"], "lower"),
            Row(f"burst_{kind}_doubled", o["doubled"], p["doubled"], "lower"),
            Row(f"burst_{kind}_leaked", o["leaked"], p["leaked"], "lower"),
        ]
        doc[kind] = st
    extra["burst"] = doc
    return rows


async def _delete_all(side: Side) -> None:
    """Delete what the users of both systems would: claims, sandboxes, pods."""
    for res in (peer.CLAIMS, peer.SANDBOXES, PODS):
        items = (await side.observer.list(res, side.namespace))["items"]
        await asyncio.gather(*(_delete_one(side, res, o) for o in items))


async def _delete_one(side: Side, res: Any, obj: dict[str, Any]) -> None:
    try:
        await side.kube.delete(res, obj["metadata"]["name"], side.namespace)
    except ApiError as e:
        if not e.not_found:
            raise


LEAK_WAIT_S = 300.0


async def _leaks(side: Side, timeout_s: float = LEAK_WAIT_S) -> dict[str, int]:
    """Objects of each system still there ``timeout_s`` after everything was
    deleted (a system that leaks keeps them; one that is only slow does not)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pods = (await side.observer.list(PODS, side.namespace))["items"]
        sbs = (await side.observer.list(peer.SANDBOXES, side.namespace))["items"]
        claims = (await side.observer.list(peer.CLAIMS, side.namespace))["items"]
        pools = (await side.observer.list(peer.WARMPOOLS, side.namespace))["items"]
        theirs = [p for p in pods if _peer_pod(p)]
        ours = [p for p in pods if not _peer_pod(p)]
        left = {"ours": len(ours), "peer": len(theirs) + len(sbs) + len(claims) + len(pools)}
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        await asyncio.sleep(1)


def _peer_pod(pod: dict[str, Any]) -> bool:
    refs = pod["metadata"].get("ownerReferences") or []
    labels = pod["metadata"].get("labels") or {}
    return any(r.get("kind") == "Sandbox" for r in refs) or any(
        k.startswith("agents.x-k8s.io/") for k in labels
    )


def _rate(t0: float, done: list[float], n: int) -> dict[str, Any]:
    lat = [(t - t0) * 1000 for t in done]
    span = (max(done) - t0) if done else float("nan")
    return {
        "completed": len(done),
        "lost": n - len(done),
        "per_s": round(len(done) / span, 2) if done else 0.0,
        "p50_ms": summary([Sample(x, None) for x in lat], "ready_ms")["p50"],
        "p99_ms": summary([Sample(x, None) for x in lat], "ready_ms")["p99"],
        "span_s": round(span, 2),
    }


async def _burst_claims(
    side: Side, name: str, n: int, candidates: list[dict[str, Any]]
) -> dict[str, Any]:
    won: list[str] = []
    done: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    if name == "ours":
        t0 = time.monotonic()

        async def one() -> None:
            try:
                res = await claim(
                    side.kube, side.namespace, OUR_POOL, claimer="bench", ttl=CLAIM_TTL,
                    candidates=candidates, ready_only=True, reserved=side.reserved,
                )  # fmt: skip
            except Exception as e:
                errors[_why(e)] += 1
                return
            done.append(time.monotonic())
            won.append(res.pod["metadata"]["name"])

        await asyncio.gather(*(one() for _ in range(n)))
    else:
        names = [side.name("burst") for _ in range(n)]
        t0 = time.monotonic()

        async def one_peer(claim_name: str) -> None:
            try:
                await side.kube.create(
                    peer.CLAIMS, peer.claim(claim_name, PEER_POOL), side.namespace
                )
                t = await side.claims.wait(claim_name, 600)
            except Exception as e:
                errors[_why(e)] += 1
                return
            done.append(t)
            sb = peer.claimed_sandbox(side.claims.last[claim_name])
            if sb:
                won.append(sb)

        await asyncio.gather(*(one_peer(c) for c in names))
    out = _rate(t0, done, n)
    out["doubled"] = len(won) - len(set(won))
    out["errors"] = dict(errors.most_common(5))
    return out


def _why(e: BaseException) -> str:
    """A lost sandbox's cause, short enough to count alike ones together."""
    return f"{type(e).__name__}: {str(e)[:120]}"


async def _burst_creates(side: Side, name: str, n: int) -> dict[str, Any]:
    done: list[float] = []
    made: list[str] = []
    errors: collections.Counter[str] = collections.Counter()
    names = [side.name("bc") for _ in range(n)]
    t0 = time.monotonic()

    async def ours(nm: str) -> None:
        body = build_pod(
            side.image, name=nm, command=COMMAND, env={}, resources=None, ttl="30m",
            idle_timeout=None, profile=None, workspace=None, labels={}, annotations={},
            node_selector=side.node_selector, tolerations=side.tolerations,
        )  # fmt: skip
        try:
            await side.kube.create(PODS, body, side.namespace)
            made.append(nm)
            done.append(await side.pods.wait(nm, 600))
        except Exception as e:
            errors[_why(e)] += 1

    async def theirs(nm: str) -> None:
        try:
            await side.kube.create(
                peer.SANDBOXES, peer.sandbox(nm, peer_template(side)), side.namespace
            )
            made.append(nm)
            done.append(await side.sandboxes.wait(nm, 600))
        except Exception as e:
            errors[_why(e)] += 1

    await asyncio.gather(*((ours if name == "ours" else theirs)(nm) for nm in names))
    out = _rate(t0, done, n)
    out["doubled"] = len(made) - len(set(made))  # one name, one object: never above 0
    out["errors"] = dict(errors.most_common(5))
    return out


# -- RL batch ------------------------------------------------------------------------
async def _rl(
    side: Side,
    client: SandmanClient,
    args: argparse.Namespace,
    registry: str,
    ns: str,
    extra: dict[str, Any],
) -> list[Row]:
    from sandman.bench.task_images import build_task_images
    from sandman.fleet.fleet import Problem

    results = {}
    for name in ("peer", "ours"):
        tags = [f"{ns[-6:]}-{name}-{i}" for i in range(args.rl_problems)]
        refs = await asyncio.to_thread(build_task_images, registry, tags, layer_mb=args.rl_layer_mb)
        problems = [Problem(f"p{i}", ref) for i, ref in enumerate(refs)]
        if name == "ours":
            res = await ours_rl(client, side, problems, args.rl_rollouts, args.rl_concurrency)
        else:
            res = await peer_rl(side, problems, args.rl_rollouts, args.rl_concurrency)
        results[name] = res.as_json()
        print(f"RL batch, {name}: {results[name]}", flush=True)
        await clear(side)
        await _pools_gone(side, timeout_s=600)
    extra["rl"] = {
        **results,
        "problems": args.rl_problems,
        "rollouts": args.rl_rollouts,
        "concurrency": args.rl_concurrency,
    }
    o, p = results["ours"], results["peer"]
    return [
        Row("rl_pods_created", o["pods_created"], p["pods_created"], "lower"),
        Row("rl_wall_s", o["wall_s"], p["wall_s"], "lower"),
    ]


# -- the table -----------------------------------------------------------------------
def _table(results: dict[str, Any]) -> str:
    keys = sorted(k[len("ratio_") :] for k in results if k.startswith("ratio_"))
    lines = [
        f"{'row':<48} {'ours':>12} {'peer':>12} {'ours better':>12}",
        "-" * 87,
    ]
    for k in keys:
        o, p, r = results[f"ours_{k}"], results[f"peer_{k}"], results[f"ratio_{k}"]
        lines.append(f"{k:<48} {_fmt(o):>12} {_fmt(p):>12} {_fmt(r, 'x'):>12}")
    for t in results.get("targets", []):
        state = {True: "met", False: "NOT met", None: "not measured"}[t["met"]]
        lines.append(
            f"target: {t['target']}: {state}"
            + (f" ({'; '.join(t['short'])})" if t["short"] else "")
        )
    return "\n".join(lines)


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}{unit}" if abs(v) < 1000 else f"{v:.0f}{unit}"
    return f"{v}{unit}"
