"""Fleets end to end on the real node: every strategy, reuse, drift."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest

from sandman.client import Sandbox, SandmanClient
from sandman.fleet.fleet import Fleet, FleetConfig, Problem
from sandman.fleet.records import Outcome, Source
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.kube_async import EVENTS, PODS, REPLICASETS
from sandman.pools import PoolSpec, replicaset_name
from sandman.pools.manager import ManagerConfig, PoolManager

REAL = {"sandman.dev/node-kind": "real"}


@pytest.fixture
async def sdk(
    cluster: LocalCluster, namespace: str, real_node: RealNode
) -> AsyncIterator[SandmanClient]:
    async with SandmanClient(kubeconfig=cluster.kubeconfig, namespace=namespace) as client:
        yield client


async def pristine_task(sb: Sandbox, problem: Problem, rollout: int) -> float:
    """Edits files and leaves a process behind; reward 1 only on a pristine start."""
    before = await sb.exec("test ! -e /tmp/mark && ! ps | grep -q '[s]leep 301' && cat /problem")
    await sb.write_file("/tmp/mark", f"{rollout}")
    await sb.start(["sleep", "301"])
    return 1.0 if before.exit_code == 0 and before.stdout == f"{problem.id}\n" else 0.0


async def _leftovers(sdk: SandmanClient, run_id: str) -> list[str]:
    pods = (await sdk.kube.list(PODS, sdk.namespace, label_selector=f"sandman.dev/run={run_id}"))[
        "items"
    ]
    rs = (await sdk.kube.list(REPLICASETS, sdk.namespace))["items"]
    return [p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")] + [
        r["metadata"]["name"] for r in rs if not r["metadata"].get("deletionTimestamp")
    ]


@pytest.mark.parametrize(
    ("strategy", "reuse"),
    [
        ("none", False),
        ("naive", False),
        ("sliding", False),
        ("pipelined", False),
        ("pipelined", True),
    ],
)
async def test_each_strategy_completes_a_batch_with_correct_results(
    sdk: SandmanClient, images: dict[str, str], strategy: str, reuse: bool
) -> None:
    # One image for all problems: the tiny image writes no /problem, so the
    # problem id is passed by a file the task checks for (written by setup).
    problems = [Problem(f"p{i}", images["tiny"]) for i in range(3)]

    async def task(sb: Sandbox, problem: Problem, rollout: int) -> float:
        await sb.write_file("/problem", problem.id + "\n")
        return await pristine_task(sb, problem, rollout)

    cfg = FleetConfig(
        strategy=strategy,
        concurrency=4,
        window=1,
        reuse=reuse,
        k=1,
        command=["sleep", "infinity"],
        node_selector=REAL,
    )
    fleet = Fleet(sdk, cfg)
    data = await fleet.run(problems, 3, task)
    assert len(data.records) == 9
    bad = [(r.problem, r.rollout, r.outcome, r.reward, r.detail) for r in data.records]
    assert all(r.outcome is Outcome.OK and r.reward == 1.0 for r in data.records), bad
    sources = {r.final.source for r in data.records if r.final}
    if strategy != "none":
        assert Source.CLAIMED in sources  # the pools were used
    if reuse:
        assert Source.REUSED in sources and data.counters.resets == 6
        # k=1: each problem's three rollouts ran on one sandbox (no drift here).
        # pods_created may exceed 3: refills cancelled while a pool warms.
        assert len({r.final.sandbox for r in data.records if r.final}) == 3
    assert data.counters.pods_created >= (3 if reuse else 9)
    assert await _leftovers(sdk, fleet.run_id) == []  # pools and sandboxes released


async def test_reuse_replaces_a_sandbox_with_unfixable_drift(
    sdk: SandmanClient, images: dict[str, str]
) -> None:
    """Rollout 0 destroys the workspace's git history: /v1/reset cannot restore
    that, reports drift, and the fleet quarantines the sandbox and starts the
    next rollout on a new one instead of reusing it."""

    async def task(sb: Sandbox, problem: Problem, rollout: int) -> float:
        head = await sb.exec("git rev-parse HEAD", cwd="/work/repo")
        if rollout == 0:
            await sb.exec("rm -rf /work/repo/.git")
        return 1.0 if head.exit_code == 0 else 0.0

    cfg = FleetConfig(
        strategy="none",
        concurrency=1,
        reuse=True,
        k=1,
        command=["sleep", "infinity"],
        node_selector=REAL,
        keep_quarantined=True,
    )
    fleet = Fleet(sdk, cfg)
    data = await fleet.run([Problem("swe", images["swe"])], 3, task)
    assert [r.reward for r in data.records] == [1.0, 1.0, 1.0]
    assert data.counters.resets_dirty == 1
    first, second, third = (r.final for r in data.records)
    assert first and second and third
    assert second.sandbox != first.sandbox and second.source is Source.CREATED
    assert third.source is Source.REUSED and third.sandbox == second.sandbox
    spans = {s.name: s for s in data.spans}
    assert spans[first.sandbox].quarantined
    # Kept for a post-mortem, labeled, out of the run's hands (its lease ends it).
    pod = await sdk.kube.get(PODS, first.sandbox, sdk.namespace)
    assert pod["metadata"]["labels"]["sandman.dev/state"] == "quarantined"
    assert not pod["metadata"].get("deletionTimestamp")


async def test_a_pool_whose_pods_cannot_start_is_visible_and_stops_growing(
    sdk: SandmanClient, real_node: RealNode
) -> None:
    missing = f"{real_node.node.registry}/sandman/missing:never"
    spec = PoolSpec("broken", missing, size=2, command=["sleep", "infinity"], node_selector=REAL)
    cfg = ManagerConfig(tick_s=0.1, status_every_s=0.5)
    async with PoolManager(sdk.kube, sdk.namespace, cfg) as pm:
        await pm.ensure(spec)
        deadline = time.monotonic() + 90
        while pm.health("broken").condition != "Failing":
            assert time.monotonic() < deadline, pm.health("broken")
            await asyncio.sleep(0.2)
        assert "ImageNotFound" in pm.health("broken").reasons
        pm.set_target("broken", 10)  # more demand must not mean more doomed pods
        await asyncio.sleep(2.0)
        rs = await sdk.kube.get(REPLICASETS, replicaset_name("broken"), sdk.namespace)
        assert rs["spec"]["replicas"] <= 2
        status = json.loads(rs["metadata"]["annotations"]["sandman.dev/pool-status"])
        assert status["condition"] == "Failing" and status["failing"] >= 1
        events = (await sdk.kube.list(EVENTS, sdk.namespace))["items"]
        failing = [e for e in events if e["reason"] == "PoolFailing"]
        assert failing and failing[0]["involvedObject"]["kind"] == "ReplicaSet"
        assert "ImageNotFound" in failing[0]["message"]


async def test_a_missing_image_is_an_infrastructure_failure_never_a_reward(
    sdk: SandmanClient, images: dict[str, str], real_node: RealNode
) -> None:
    missing = f"{real_node.node.registry}/sandman/missing:never"
    problems = [Problem("good", images["tiny"]), Problem("gone", missing)]

    async def task(sb: Sandbox, problem: Problem, rollout: int) -> float:
        return 1.0 if (await sb.exec("true")).exit_code == 0 else 0.0

    cfg = FleetConfig(
        strategy="sliding",
        window=2,
        concurrency=4,
        command=["sleep", "infinity"],
        node_selector=REAL,
    )
    data = await Fleet(sdk, cfg).run(problems, 3, task)
    assert len(data.records) == 6  # nothing dropped
    by = {(r.problem, r.rollout): r for r in data.records}
    assert all(by[("good", i)].outcome is Outcome.OK for i in range(3))
    for i in range(3):
        rec = by[("gone", i)]
        assert rec.outcome is Outcome.INFRA_FAILED and rec.reward is None
        assert rec.final and rec.final.error_reason == "ImageNotFound"
        assert rec.final.retryable is False
