"""A pool plan that meets an outage (webhook down, apiserver restarting) is
retried, never leaves a pool the manager does not know, and never ends the run.

Seen in `sandman bench scale --chaos`: the webhook was killed while a fleet ran;
the dispatcher's plan raised HTTP 500 "failed calling webhook" out of the run,
and a later plan hit a KeyError for a pool whose ensure had failed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandman.fleet import fleet as fleet_mod
from sandman.fleet.fleet import Fleet, FleetConfig, Problem
from sandman.fleet.reuse import ProblemState
from sandman.kube_async import ApiError


class FakePools:
    """The pool manager's surface the planner uses; ensure fails as told."""

    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.known: dict[str, int] = {}
        self.ensured: list[str] = []

    async def ensure(self, spec: Any) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.ensured.append(spec.name)
        self.known[spec.name] = 0

    def set_target(self, pool: str, idle: int) -> None:
        self.known[pool] = idle  # KeyError-free only for pools ensured

    async def delete(self, pool: str) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.known.pop(pool, None)


def planned_fleet(failures: list[BaseException]) -> tuple[Fleet, FakePools]:
    f = Fleet.__new__(Fleet)
    f.config = FleetConfig(strategy="pipelined", window=1)
    f.k = 2  # what run() resolves from the batch
    f.run_id = "r0"
    f.problems = [Problem("p0", "127.0.0.1:5000/x:1")]
    f.state = [ProblemState(0, 2, 2, 2)]
    f.pools, f.pool_problem, f.unconfirmed = {}, {}, set()
    f.changed, f.replan, f.plan_lock = asyncio.Event(), asyncio.Event(), asyncio.Lock()
    f.prepuller = None
    f._pool_spec = lambda name, problem, n: type("Spec", (), {"name": name})()  # type: ignore[method-assign]
    pm = FakePools(failures)
    f.pm = pm  # type: ignore[assignment]
    return f, pm


async def test_an_outage_is_planned_again_and_the_pool_registered_once_it_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fleet_mod, "PLAN_RETRY_S", 0.01)
    f, pm = planned_fleet([ApiError(500, "failed calling webhook"), ConnectionResetError()])
    await f._plan()  # raises nothing
    assert f.pools == {} and pm.known == {}
    assert f.unconfirmed == {"r0-0"}  # it may exist all the same: the cleanup deletes it
    await asyncio.wait_for(f.changed.wait(), 5)  # a retry is due
    f.changed.clear()
    await f._plan()  # the connection reset: again nothing registered
    assert f.pools == {}
    await f._plan()
    assert f.pools == {0: "r0-0"} and pm.ensured == ["r0-0"] and "r0-0" in pm.known
    assert f.unconfirmed == set()


async def test_an_answer_that_is_a_refusal_still_ends_the_run() -> None:
    f, _ = planned_fleet([ApiError(403, "denied by policy")])
    with pytest.raises(ApiError):
        await f._plan()


async def test_a_pool_whose_delete_failed_is_kept_and_deleted_at_the_next_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fleet_mod, "PLAN_RETRY_S", 0.01)
    f, pm = planned_fleet([])
    await f._plan()
    assert f.pools == {0: "r0-0"}
    f.state[0].unserved = 0  # every rollout served: the plan deletes the pool
    pm.failures.append(TimeoutError())
    await f._plan()  # the delete timed out: the pool is still the fleet's to delete
    assert f.pools == {0: "r0-0"} and "r0-0" in pm.known
    await asyncio.wait_for(f.changed.wait(), 5)
    await f._plan()
    assert f.pools == {} and pm.known == {}
