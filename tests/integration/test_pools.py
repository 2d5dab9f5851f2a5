"""Warm pools on the real control plane (pods on kwok nodes): claims, refills,
the shared create budget and the manager's expectations."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator

import pytest

from sandman.client import startup
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, KWOK_TOLERATION, NODE_KIND_LABEL
from sandman.harness.cluster.local import LocalCluster
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
    deadline = time.monotonic() + timeout
    while len(await idle_ready(kube, ns, pool)) < n:
        assert time.monotonic() < deadline, f"pool {pool} never had {n} idle Ready pods"
        await asyncio.sleep(0.2)


async def test_concurrent_claims_never_share_a_pod_and_the_pool_refills(
    kube: KubeClient, namespace: str
) -> None:
    spec = kwok_pool("race", size=8)
    await kube.create(REPLICASETS, spec.replicaset(), namespace)
    await wait_idle(kube, namespace, "race", 8)

    async def claimer(i: int) -> str:
        # Each task keeps trying until it wins one (the pool refills meanwhile).
        deadline = time.monotonic() + 60
        while True:
            try:
                res = await claim(
                    kube, namespace, "race", claimer=f"t{i}", ttl=dt.timedelta(minutes=10)
                )
                return str(res.pod["metadata"]["name"])
            except NoIdlePod:
                assert time.monotonic() < deadline, f"claimer {i} never won a pod"
                await asyncio.sleep(0.1)

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
    deadline = time.monotonic() + 60
    while await idle_ready(kube, namespace, "race"):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    for name in names:
        assert not (await kube.get(PODS, name, namespace))["metadata"].get("deletionTimestamp")


async def test_manager_shares_one_create_budget_across_pools(
    kube: KubeClient, namespace: str
) -> None:
    cfg = ManagerConfig(create_rate=4.0, create_burst=4, tick_s=0.1)
    async with PoolManager(kube, namespace, cfg) as pm:
        t0 = time.monotonic()
        for i in range(5):
            await pm.ensure(kwok_pool(f"b{i}", size=6))  # 30 pods wanted at once
        await asyncio.sleep(2.0)
        granted = sum(pm._pools[f"b{i}"].replicas for i in range(5))
        elapsed = time.monotonic() - t0
        # burst + rate x time, across all five pools together (not per pool)
        assert granted <= 4 + 4 * elapsed + 1, (granted, elapsed)
        assert granted >= 4
        # Fair: no pool got everything while another got nothing.
        shares = [pm._pools[f"b{i}"].replicas for i in range(5)]
        assert all(n >= 1 for n in shares), shares


async def test_manager_does_not_over_create_and_respects_a_manual_scale(
    kube: KubeClient, namespace: str
) -> None:
    cfg = ManagerConfig(create_rate=50.0, create_burst=50, tick_s=0.05)
    async with PoolManager(kube, namespace, cfg) as pm:
        await pm.ensure(kwok_pool("exp", size=5))
        await wait_idle(kube, namespace, "exp", 5)
        await asyncio.sleep(1.0)  # many reconcile passes on a settled pool
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
        # Demand of 3 met by the 3 warm pods: claims must not cause refills.
        for _ in range(3):
            await pm.claim("tail", claimer="me", ttl=dt.timedelta(minutes=5))
        await asyncio.sleep(1.0)
        rs = await kube.get(REPLICASETS, replicaset_name("tail"), namespace)
        assert rs["spec"]["replicas"] == 0
        # All three claims were two-phase (every idle pod Ready): no refill
        # was ever created, so the pool's pods are exactly the three claimed.
        assert pm.stats.refills_avoided == 3
        assert pm.stats.pool_pods_created == 3
        with pytest.raises(NoIdlePod):
            await pm.claim("tail", claimer="me", ttl=dt.timedelta(minutes=5))
