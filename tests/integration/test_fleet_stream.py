"""Streaming fleets on the real control plane (pods on kwok nodes): results arrive as
rollouts complete, while others are still running, so a trainer can consume partial
batches; a failing callback is loud but never strands the run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from sandman.client import Sandbox, SandmanClient
from sandman.fleet.fleet import Fleet, FleetConfig, Problem
from sandman.fleet.records import Outcome, RolloutRecord
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, KWOK_TOLERATION, NODE_KIND_LABEL
from sandman.harness.cluster.local import LocalCluster
from sandman.kube_async import PODS, REPLICASETS

# Bounds a hang, never a speed: a fleet that only reported at the end would block here.
WAIT_S = 120


def kwok_config(**kw: object) -> FleetConfig:
    return FleetConfig(
        concurrency=4, command=["sleep", "infinity"], node_selector={NODE_KIND_LABEL: "kwok"},
        tolerations=[KWOK_TOLERATION], **kw,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.fixture
async def sdk(cluster: LocalCluster, namespace: str) -> AsyncIterator[SandmanClient]:
    async with SandmanClient(kubeconfig=cluster.kubeconfig, namespace=namespace) as client:
        yield client


async def test_results_stream_while_other_rollouts_still_run(sdk: SandmanClient) -> None:
    problems = [Problem(f"p{i}", KWOK_IMAGE) for i in range(3)]
    gate = asyncio.Event()

    async def task(sb: Sandbox, problem: Problem, rollout: int) -> float:
        if problem.id != "p0":
            await gate.wait()  # held until the test has seen p0's results
        return 1.0 if rollout == 0 else 0.5

    fleet = Fleet(sdk, kwok_config())
    seen: list[RolloutRecord] = []
    results = fleet.stream(problems, 2, task)
    async with asyncio.timeout(WAIT_S):
        while len(seen) < 2:
            seen.append(await anext(results))
    # Both of p0's results arrived while p1 and p2 were still waiting on the gate.
    assert {(r.problem, r.rollout, r.reward) for r in seen} == {("p0", 0, 1.0), ("p0", 1, 0.5)}
    mid = fleet.progress()
    assert (mid.total, mid.done, mid.failed) == (6, 2, 0)
    assert mid.running + mid.waiting == 4 and mid.running >= 1
    gate.set()
    async with asyncio.timeout(WAIT_S):
        seen += [r async for r in results]
    assert sorted((r.problem, r.rollout) for r in seen) == [
        (p, r) for p in ("p0", "p1", "p2") for r in (0, 1)
    ]
    assert all(r.outcome is Outcome.OK for r in seen)
    assert len(fleet.data.records) == 6 and fleet.progress().done == 6


async def test_a_failing_callback_is_raised_after_the_run_cleans_up(sdk: SandmanClient) -> None:
    calls = []

    def on_result(rec: RolloutRecord) -> None:
        calls.append(rec)
        raise RuntimeError("trainer bug")

    async def task(sb: Sandbox, problem: Problem, rollout: int) -> float:
        return 1.0

    fleet = Fleet(sdk, kwok_config())
    with pytest.raises(RuntimeError, match="trainer bug"):
        async with asyncio.timeout(WAIT_S):
            await fleet.run([Problem("p", KWOK_IMAGE)], 3, task, on_result=on_result)
    # Every rollout still finished and was reported, and nothing of the run is left.
    assert len(calls) == 3 and all(r.outcome is Outcome.OK for r in fleet.data.records)
    pods = await sdk.kube.list(
        PODS, sdk.namespace, label_selector=f"sandman.dev/run={fleet.run_id}"
    )
    assert all(p["metadata"].get("deletionTimestamp") for p in pods["items"])


async def test_a_run_cancelled_while_its_pools_are_made_leaves_none(sdk: SandmanClient) -> None:
    """Cancelled mid-plan (pool creates in flight), the run still deletes every
    pool it may have made: none is left for nobody to manage."""
    problems = [Problem(f"p{i}", KWOK_IMAGE) for i in range(8)]

    async def task(sb: Sandbox, problem: Problem, rollout: int) -> float:
        await asyncio.sleep(3600)
        return 1.0

    fleet = Fleet(sdk, kwok_config(strategy="naive"))
    run = asyncio.create_task(fleet.run(problems, 2, task))
    prefix = f"pool-{fleet.run_id}-"

    async def pools() -> list[str]:
        rs = (await sdk.kube.list(REPLICASETS, sdk.namespace))["items"]
        return [
            r["metadata"]["name"]
            for r in rs
            if r["metadata"]["name"].startswith(prefix)
            and not r["metadata"].get("deletionTimestamp")
        ]

    async with asyncio.timeout(WAIT_S):
        while not await pools():  # the first pool exists: the others are on their way
            await asyncio.sleep(0.01)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert await pools() == []
