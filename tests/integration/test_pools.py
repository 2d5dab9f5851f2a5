"""Warm pools on the real control plane (pods on kwok nodes): claims, refills,
the shared create budget and the manager's expectations."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest

from sandman.client import startup
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, KWOK_TOLERATION, NODE_KIND_LABEL
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.testing import async_wait_for
from sandman.kube_async import JSON_PATCH, PODS, REPLICASETS, KubeClient
from sandman.pools import NoIdlePod, PoolSpec, claim, pool_selector, replicaset_name
from sandman.pools.manager import ManagerConfig, PoolManager


def kwok_pool(name: str, size: int = 0) -> PoolSpec:
    return PoolSpec(
        name,
        KWOK_IMAGE,
        size=size,
        command=["sleep", "infinity"],
        node_selector={NODE_KIND_LABEL: "kwok"},
        tolerations=[KWOK_TOLERATION],
    )


@pytest.fixture
async def kube(cluster: LocalCluster) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(cluster.kubeconfig) as k:
        yield k


async def idle_ready(kube: KubeClient, ns: str, pool: str) -> list[dict]:
    pods = (await kube.list(PODS, ns, label_selector=pool_selector(pool)))["items"]
    return [p for p in pods if startup.ready(p) and not p["metadata"].get("deletionTimestamp")]


async def wait_idle(kube: KubeClient, ns: str, pool: str, n: int, timeout: float = 60) -> None:
    async def enough() -> bool:
        return len(await idle_ready(kube, ns, pool)) >= n

    await async_wait_for(enough, timeout=timeout, what=f"{n} idle Ready pods in pool {pool}")


async def replicas(kube: KubeClient, ns: str, pool: str) -> int:
    return int((await kube.get(REPLICASETS, replicaset_name(pool), ns))["spec"]["replicas"])


async def settled(kube: KubeClient, ns: str, pool: str) -> dict | None:
    """The pool's ReplicaSet once its controller has acted on the latest spec
    and holds exactly that many pods (None until then)."""
    rs = await kube.get(REPLICASETS, replicaset_name(pool), ns)
    st = rs.get("status") or {}
    done = (
        st.get("observedGeneration") == rs["metadata"]["generation"]
        and st.get("replicas", 0) == rs["spec"]["replicas"]
    )
    return rs if done else None


async def test_concurrent_claims_never_share_a_pod_and_the_pool_refills(
    kube: KubeClient, namespace: str
) -> None:
    spec = kwok_pool("race", size=8)
    await kube.create(REPLICASETS, spec.replicaset(), namespace)
    await wait_idle(kube, namespace, "race", 8)

    async def claimer(i: int) -> str:
        # Each task keeps trying until it wins one (the pool refills meanwhile).
        async def attempt() -> str | None:
            try:
                res = await claim(
                    kube, namespace, "race", claimer=f"t{i}", ttl=dt.timedelta(minutes=10)
                )
            except NoIdlePod:
                return None
            return str(res.pod["metadata"]["name"])

        return await async_wait_for(attempt, what=f"claimer {i} winning a pod")

    names = await asyncio.gather(*(claimer(i) for i in range(24)))
    assert len(set(names)) == 24  # no pod claimed twice
    for name in names:
        pod = await kube.get(PODS, name, namespace)
        md = pod["metadata"]
        assert md["labels"]["sandman.dev/state"] == "claimed"
        assert not md.get("ownerReferences")  # left the ReplicaSet atomically
        assert md["annotations"]["sandman.dev/claimed-by"].startswith("t")
        assert "sandman.dev/expires-at" in md["annotations"]
    await wait_idle(kube, namespace, "race", 8)  # refilled to its size
    # Deleting the pool takes its idle pods, never the claimed ones.
    await kube.delete(
        REPLICASETS, replicaset_name("race"), namespace, propagation_policy="Foreground"
    )

    async def no_idle() -> bool:
        return not await idle_ready(kube, namespace, "race")

    await async_wait_for(no_idle, what="the pool's idle pods deleted with it")
    for name in names:
        assert not (await kube.get(PODS, name, namespace))["metadata"].get("deletionTimestamp")


async def test_claims_of_one_process_sharing_reservations_never_race_each_other(
    kube: KubeClient, namespace: str
) -> None:
    # Sixteen claims at once on sixteen candidates from one list: without the
    # shared reservations they pick the same pods (random picks collide) and
    # each collision costs a lost patch; with them every claim wins first time.
    spec = kwok_pool("share", size=16)
    await kube.create(REPLICASETS, spec.replicaset(), namespace)
    await wait_idle(kube, namespace, "share", 16)
    candidates = await idle_ready(kube, namespace, "share")
    reserved: set[str] = set()

    def one(i: int) -> Awaitable[Any]:
        return claim(
            kube, namespace, "share", claimer=f"t{i}", ttl=dt.timedelta(minutes=10),
            candidates=candidates, ready_only=True, rng=random.Random(i), reserved=reserved,
        )  # fmt: skip

    results = await asyncio.gather(*(one(i) for i in range(16)))
    assert len({r.pod["metadata"]["name"] for r in results}) == 16
    assert [r.conflicts for r in results] == [0] * 16
    # Won pods stay reserved until their owner's cache shows them claimed.
    assert reserved == {r.pod["metadata"]["uid"] for r in results}
    # A seventeenth finds nothing left to try on that list and says so.
    with pytest.raises(NoIdlePod):
        await claim(
            kube, namespace, "share", claimer="late", ttl=dt.timedelta(minutes=10),
            candidates=candidates, ready_only=True, reserved=reserved,
        )  # fmt: skip


async def _all_positive(values: Awaitable[list[int]]) -> list[int] | None:
    got = await values
    return got if all(n >= 1 for n in got) else None


async def test_manager_shares_one_create_budget_across_pools(
    kube: KubeClient, namespace: str
) -> None:
    cfg = ManagerConfig(create_rate=4.0, create_burst=4, tick_s=0.1)
    async with PoolManager(kube, namespace, cfg) as pm:
        t0 = time.monotonic()
        pools = [f"b{i}" for i in range(5)]
        for name in pools:
            await pm.ensure(kwok_pool(name, size=6))  # 30 pods wanted at once

        async def shares() -> list[int]:
            return [await replicas(kube, namespace, name) for name in pools]

        # Fair: every pool gets a pod early (5 tokens: the burst of 4, then
        # one more at 4/s), none waits for another to be full.
        got = await async_wait_for(
            lambda: _all_positive(shares()), timeout=30, what="a pod for every pool"
        )
        elapsed = time.monotonic() - t0
        granted = sum(got)
        # burst + rate x time, across all five pools together (not per pool:
        # five budgets would have granted 5 x 4 at once)
        assert granted <= 4 + 4 * elapsed + 1, (granted, elapsed, got)


async def test_manager_does_not_over_create_and_respects_a_manual_scale(
    kube: KubeClient, namespace: str
) -> None:
    cfg = ManagerConfig(create_rate=50.0, create_burst=50, tick_s=0.05)
    async with PoolManager(kube, namespace, cfg) as pm:
        await pm.ensure(kwok_pool("exp", size=5))
        await wait_idle(kube, namespace, "exp", 5)
        passes = pm.stats.reconciles  # then many reconcile passes on a settled pool
        await async_wait_for(lambda: pm.stats.reconciles >= passes + 10, what="10 passes")
        rs = await kube.get(REPLICASETS, replicaset_name("exp"), namespace)
        assert rs["spec"]["replicas"] == 5
        pods = await kube.list(PODS, namespace, label_selector=pool_selector("exp", None))
        assert len(pods["items"]) == 5  # created exactly what was asked
        assert pm.stats.pool_pods_created == 5
        # Someone scales the pool by hand: the manager's next write fails its
        # precondition, it re-reads, and it brings the pool back to its target.
        await kube.patch(
            REPLICASETS,
            replicaset_name("exp"),
            [{"op": "replace", "path": "/spec/replicas", "value": 2}],
            namespace,
            content_type=JSON_PATCH,
        )
        pm.set_target("exp", 6)
        await wait_idle(kube, namespace, "exp", 6)
        assert pm.stats.scale_conflicts >= 1
        rs = await kube.get(REPLICASETS, replicaset_name("exp"), namespace)
        assert rs["spec"]["replicas"] == 6


async def test_claim_through_the_manager_refills_only_while_wanted(
    kube: KubeClient, namespace: str
) -> None:
    async with PoolManager(kube, namespace, ManagerConfig(tick_s=0.05)) as pm:
        await pm.ensure(kwok_pool("tail", size=3))
        await wait_idle(kube, namespace, "tail", 3)
        # The manager decides from its own cache, which can trail the API:
        # with a pod still starting there, a claim is rightly one-phase.
        await async_wait_for(lambda: pm.health("tail").ready == 3, what="manager sees 3 ready")
        # Demand of 3 met by the 3 warm pods: claims must not cause refills.
        for _ in range(3):
            await pm.claim("tail", claimer="me", ttl=dt.timedelta(minutes=5))
        # The ReplicaSet controller has acted on the last scale-down, and the
        # manager has had passes to (wrongly) grow the pool again.
        rs = await async_wait_for(lambda: settled(kube, namespace, "tail"), what="settled")
        passes = pm.stats.reconciles
        await async_wait_for(lambda: pm.stats.reconciles >= passes + 10, what="10 passes")
        assert rs["spec"]["replicas"] == 0
        assert await replicas(kube, namespace, "tail") == 0
        # All three claims were two-phase (every idle pod Ready): no refill
        # was ever created, so the pool's pods are exactly the three claimed.
        assert pm.stats.refills_avoided == 3
        assert pm.stats.pool_pods_created == 3
        with pytest.raises(NoIdlePod):
            await pm.claim("tail", claimer="me", ttl=dt.timedelta(minutes=5))
