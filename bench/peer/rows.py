"""The side-by-side workloads: cold starts, warm claims, bursts, and what a lifecycle costs.

Every workload runs once per system per round, the order alternating by
round, on the same image, command and nodes, with nothing of the other
system in flight: a round waits for its own sandboxes to be gone (and, for
warm rows, for both pools to be full again) before the next one starts.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sandman.bench.peer import objects as peer
from sandman.bench.peer.exec_api import ApiExec
from sandman.bench.peer.watch import ReadyLog
from sandman.client import Sandbox, SandmanClient, startup
from sandman.client.sandbox import build_pod
from sandman.kube_async import PODS, REPLICASETS, ApiError, KubeClient, list_all
from sandman.pools.claim import NoIdlePod, claim
from sandman.pools.spec import PoolSpec, pool_selector
from sandman.stats import percentile

COMMAND = ["sleep", "infinity"]
FIRST = ["true"]
CLAIM_TTL = dt.timedelta(minutes=30)
READY_TIMEOUT_S = 300.0
GONE_TIMEOUT_S = 300.0


@dataclass
class Sample:
    ready_ms: float  # request -> Ready (ours: pod Ready / claim bound; peer: Ready condition)
    first_ms: float | None  # request -> first command's result


@dataclass
class Side:
    """What a workload needs of the cluster, for one run of the bench."""

    kube: KubeClient
    client: SandmanClient
    namespace: str
    image: str
    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]
    pods: ReadyLog  # every pod of the namespace
    sandboxes: ReadyLog  # the peer's Sandbox objects
    claims: ReadyLog  # the peer's SandboxClaim objects
    api_exec: ApiExec
    observer: KubeClient  # the bench's own waiting lists (counted apart)
    # Pods our claims of this run are trying or won (claim(reserved=)): the
    # bench claims from one process, as a fleet does.
    reserved: set[str] = field(default_factory=set)
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def name(self, prefix: str) -> str:
        return f"{prefix}-{secrets.token_hex(4)}"


def summary(samples: list[Sample], key: str) -> dict[str, float]:
    vals = [getattr(s, key) for s in samples if getattr(s, key) is not None]
    if not vals:
        return {"p50": float("nan"), "p99": float("nan")}
    return {"p50": round(percentile(vals, 50), 1), "p99": round(percentile(vals, 99), 1)}


def load_mark() -> float:
    return round(os.getloadavg()[0], 2)


# -- cold ----------------------------------------------------------------------------
async def ours_cold(side: Side, *, first: bool = True) -> Sample:
    t0 = time.monotonic()
    sb = await Sandbox.create(
        side.client,
        side.image,
        command=COMMAND,
        node_selector=side.node_selector,
        tolerations=side.tolerations,
        timeout_s=READY_TIMEOUT_S,
    )
    # Ready for ours is when the SDK says so: its daemon answered (the pod's
    # Ready condition follows at the kubelet's next readiness probe).
    ready = time.monotonic()
    first_ms = None
    if first:
        r = await sb.exec(FIRST)
        first_ms = (time.monotonic() - t0) * 1000
        if r.exit_code != 0:
            raise RuntimeError(f"{sb.name}: `true` exited {r.exit_code}")
    return Sample((ready - t0) * 1000, first_ms)


def peer_template(side: Side, *, sandman_label: bool = False) -> dict[str, Any]:
    if not sandman_label:
        return peer.pod_template(
            side.image, COMMAND, node_selector=side.node_selector, tolerations=side.tolerations
        )
    # The pod Sandman's SDK would create, as the peer's template: the webhook
    # injects the daemon into the pod the peer's controller creates.
    pod = build_pod(
        side.image,
        name=None,
        command=COMMAND,
        env={},
        resources=None,
        ttl=None,
        idle_timeout=None,
        profile=None,
        workspace=None,
        labels={},
        annotations={},
        node_selector=side.node_selector,
        tolerations=side.tolerations,
    )
    meta = pod["metadata"]
    return {
        "metadata": {"labels": meta.get("labels", {}), "annotations": meta.get("annotations", {})},
        "spec": pod["spec"],
    }


async def peer_cold(side: Side, *, sandman_label: bool = False, first: bool = True) -> Sample:
    name = side.name("peer")
    t0 = time.monotonic()
    await side.kube.create(
        peer.SANDBOXES, peer.sandbox(name, peer_template(side, sandman_label=sandman_label)),
        side.namespace,
    )  # fmt: skip
    ready = await side.sandboxes.wait(name, READY_TIMEOUT_S)
    first_ms = None
    if first:
        pod = peer.sandbox_pod(side.sandboxes.last[name])
        if sandman_label:
            obj = await side.kube.get(PODS, pod, side.namespace)
            r = await Sandbox(side.client, obj).exec(FIRST)
            if r.exit_code != 0:
                raise RuntimeError(f"{pod}: `true` exited {r.exit_code}")
        else:
            await side.api_exec.run(side.namespace, pod, FIRST)
        first_ms = (time.monotonic() - t0) * 1000
    return Sample((ready - t0) * 1000, first_ms)


# -- cleanup between rounds ----------------------------------------------------------
def _owner_kinds(obj: dict[str, Any]) -> set[str]:
    return {r.get("kind", "") for r in obj["metadata"].get("ownerReferences") or []}


def pool_owned(obj: dict[str, Any]) -> bool:
    """A warm pool's idle member: ours are owned by the pool's ReplicaSet, the
    peer's sandboxes by their SandboxWarmPool (a claim takes the ownership)."""
    return bool(_owner_kinds(obj) & {"ReplicaSet", "SandboxWarmPool"})


async def clear(side: Side) -> None:
    """Delete every claimed or cold sandbox of both systems; keep the pools' idle
    members; wait until what was deleted is gone."""
    claims, _ = await list_all(side.kube, peer.CLAIMS, side.namespace)
    sandboxes, _ = await list_all(side.kube, peer.SANDBOXES, side.namespace)
    pods, _ = await list_all(side.kube, PODS, side.namespace)
    await asyncio.gather(
        *(_delete(side.kube, peer.CLAIMS, o, side.namespace) for o in claims),
        *(
            _delete(side.kube, peer.SANDBOXES, o, side.namespace)
            for o in sandboxes
            if not pool_owned(o)
        ),
        *(_delete(side.kube, PODS, p, side.namespace) for p in pods if not _owner_kinds(p)),
    )
    await wait_gone(side)
    side.reserved.clear()  # every pod a claim of ours won is gone


async def _delete(kube: KubeClient, res: Any, obj: dict[str, Any], ns: str) -> None:
    try:
        await kube.delete(res, obj["metadata"]["name"], ns, propagationPolicy="Background")
    except ApiError as e:
        if not e.not_found:
            raise


async def leftovers(side: Side) -> list[str]:
    """What of either system is still there outside the pools' idle members."""
    claims, _ = await list_all(side.observer, peer.CLAIMS, side.namespace)
    sandboxes, _ = await list_all(side.observer, peer.SANDBOXES, side.namespace)
    pods, _ = await list_all(side.observer, PODS, side.namespace)
    pool_sandboxes = {s["metadata"]["name"] for s in sandboxes if pool_owned(s)}
    left = [f"claim/{c['metadata']['name']}" for c in claims]
    left += [f"sandbox/{s['metadata']['name']}" for s in sandboxes if not pool_owned(s)]
    for p in pods:
        kinds = _owner_kinds(p)
        if pool_owned(p):
            continue
        owners = {r.get("name") for r in p["metadata"].get("ownerReferences") or []}
        if kinds == {"Sandbox"} and owners <= pool_sandboxes:
            continue
        left.append(f"pod/{p['metadata']['name']}")
    return left


async def wait_gone(side: Side) -> None:
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while True:
        left = await leftovers(side)
        if not left:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{len(left)} objects still there after {GONE_TIMEOUT_S}s: {left[:5]}"
            )
        await asyncio.sleep(0.5)


# -- rounds --------------------------------------------------------------------------
Workload = Callable[[], Awaitable[Sample]]


async def rounds(
    side: Side,
    systems: dict[str, Workload],
    *,
    at_once: int,
    rounds_n: int,
    before: Callable[[], Awaitable[None]] | None = None,
    after: Callable[[], Awaitable[None]] | None = None,
    progress: Callable[[str], None] = print,
    label: str = "",
) -> dict[str, list[Sample]]:
    """``rounds_n`` rounds; in each, every system runs ``at_once`` of its workload
    at the same instant, one system after the other (the order alternates)."""
    out: dict[str, list[Sample]] = {k: [] for k in systems}
    names = list(systems)
    for r in range(rounds_n):
        order = names if r % 2 == 0 else names[::-1]
        for sys_name in order:
            if before is not None:
                await before()
            got = await asyncio.gather(*(systems[sys_name]() for _ in range(at_once)))
            out[sys_name] += got
            if after is not None:
                await after()
        progress(
            f"{label} round {r + 1}/{rounds_n}: "
            + ", ".join(
                f"{k} first p50 {summary(v, 'first_ms')['p50']} ms "
                f"ready p50 {summary(v, 'ready_ms')['p50']} ms"
                for k, v in out.items()
            )
        )
    return out


# -- warm pools ----------------------------------------------------------------------
OUR_POOL = "bench-peer"
PEER_POOL = "bench-peer"


async def make_pools(side: Side, size: int) -> None:
    spec = PoolSpec(
        OUR_POOL,
        side.image,
        size=size,
        command=COMMAND,
        node_selector=side.node_selector,
        tolerations=side.tolerations,
    )
    await side.kube.create(REPLICASETS, spec.replicaset(), side.namespace)
    await side.kube.create(
        peer.TEMPLATES, peer.sandbox_template(PEER_POOL, peer_template(side)), side.namespace
    )
    await side.kube.create(
        peer.WARMPOOLS, peer.warm_pool(PEER_POOL, PEER_POOL, size), side.namespace
    )


async def drop_pools(side: Side) -> None:
    from sandman.pools.spec import replicaset_name

    for res, name in (
        (REPLICASETS, replicaset_name(OUR_POOL)),
        (peer.WARMPOOLS, PEER_POOL),
        (peer.TEMPLATES, PEER_POOL),
    ):
        try:
            await side.kube.delete(res, name, side.namespace, propagationPolicy="Background")
        except ApiError as e:
            if not e.not_found:
                raise


def cpu_busy(interval_s: float = 1.0) -> float:
    """The machine's busy CPU fraction over ``interval_s`` (from /proc/stat)."""

    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields), idle

    t0, i0 = read()
    time.sleep(interval_s)
    t1, i1 = read()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


async def settle(max_busy: float = 0.25, timeout_s: float = 120.0) -> float:
    """Wait until the machine's CPUs are mostly idle (the pools' refills and the
    previous round's deletions done), so a round measures claims, not the
    node's leftover work; returns the busy fraction it started at."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = await asyncio.to_thread(cpu_busy)
        if busy <= max_busy or time.monotonic() > deadline:
            return busy
        await asyncio.sleep(0.5)


async def pools_full(side: Side, size: int, timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """Wait until both pools hold ``size`` Ready idle members; ours' idle pods."""
    deadline = time.monotonic() + timeout_s
    while True:
        pods, _ = await list_all(
            side.kube, PODS, side.namespace, label_selector=pool_selector(OUR_POOL)
        )
        ours = [p for p in pods if not p["metadata"].get("deletionTimestamp") and startup.ready(p)]
        wp = await side.observer.get(peer.WARMPOOLS, PEER_POOL, side.namespace)
        theirs = int((wp.get("status") or {}).get("readyReplicas") or 0)
        if len(ours) >= size and theirs >= size:
            return ours
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"pools not full after {timeout_s:.0f}s: ours {len(ours)}/{size}, "
                f"peer {theirs}/{size} Ready"
            )
        await asyncio.sleep(0.5)


async def ours_claim(side: Side, candidates: list[dict[str, Any]], *, first: bool = True) -> Sample:
    t0 = time.monotonic()
    for _ in range(3):
        try:
            res = await claim(
                side.kube, side.namespace, OUR_POOL, claimer="bench", ttl=CLAIM_TTL,
                candidates=candidates, ready_only=True, rng=random.Random(side.rng.random()),
                reserved=side.reserved,
            )  # fmt: skip
            break
        except NoIdlePod:
            candidates = []  # lost every race on this list: list again
    else:
        raise RuntimeError("no idle pod to claim")
    bound = time.monotonic()
    first_ms = None
    if first:
        r = await Sandbox(side.client, res.pod).exec(FIRST)
        if r.exit_code != 0:
            raise RuntimeError(f"{res.pod['metadata']['name']}: `true` exited {r.exit_code}")
        first_ms = (time.monotonic() - t0) * 1000
    return Sample((bound - t0) * 1000, first_ms)


async def peer_claim(side: Side, *, first: bool = True) -> Sample:
    name = side.name("claim")
    t0 = time.monotonic()
    await side.kube.create(peer.CLAIMS, peer.claim(name, PEER_POOL), side.namespace)
    ready = await side.claims.wait(name, READY_TIMEOUT_S)
    first_ms = None
    if first:
        sb_name = peer.claimed_sandbox(side.claims.last[name])
        if sb_name is None:
            raise RuntimeError(f"claim {name} is Ready without a sandbox in its status")
        sb = side.sandboxes.last.get(sb_name) or await side.kube.get(
            peer.SANDBOXES, sb_name, side.namespace
        )
        await side.api_exec.run(side.namespace, peer.sandbox_pod(sb), FIRST)
        first_ms = (time.monotonic() - t0) * 1000
    return Sample((ready - t0) * 1000, first_ms)
