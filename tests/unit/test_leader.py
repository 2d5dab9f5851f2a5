"""Leader election: a lapse inside one slow renewal is reported as lost + won.

The failure it guards against (seen in `sandman bench scale --chaos` on a
loaded machine): a renewal took most of the renew deadline, the reaper's
workers asked ``is_leader()`` meanwhile, were told no and dropped their due
sandboxes as a standby does; the renewal then succeeded, the election loop saw
"leading" before and after, never reported a change, and the reaper never took
those sandboxes up again (327 leases ended and were not reclaimed)."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from sandman.leader import LeaderElector

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now


class SlowLeases:
    """A Lease API whose ``get`` takes ``slow[round]`` seconds of the fake clock;
    on the last slow round ``during`` runs once that time has passed (a worker
    asking is_leader() while the renewal is still in flight)."""

    def __init__(self, clock: Clock, slow: dict[int, float], during: Any) -> None:
        self.clock, self.slow, self.during = clock, slow, during
        self.lease: dict[str, Any] | None = None
        self.rounds = 0

    async def get(self, _res: Any, _name: str, _ns: str) -> dict[str, Any]:
        from sandman.kube_async import ApiError

        self.rounds += 1
        self.clock.now += dt.timedelta(seconds=self.slow.get(self.rounds, 0.0))
        if self.rounds == max(self.slow):
            self.during()
        if self.lease is None:
            raise ApiError(404, {"reason": "NotFound"})
        return {"metadata": {"resourceVersion": "1"}, "spec": dict(self.lease["spec"])}

    async def create(self, _res: Any, body: dict[str, Any], _ns: str) -> dict[str, Any]:
        self.lease = body
        return body

    async def replace(self, _res: Any, _name: str, body: dict[str, Any], _ns: str) -> Any:
        self.lease = body
        return body


async def run_rounds(slow: dict[int, float]) -> tuple[list[bool], list[bool]]:
    clock = Clock()
    changes: list[bool] = []
    asked: list[bool] = []
    elector: LeaderElector

    def worker() -> None:
        asked.append(elector.is_leader())

    api = SlowLeases(clock, slow, during=worker)
    elector = LeaderElector(
        api,  # type: ignore[arg-type]
        namespace="ns",
        name="lease",
        identity="me",
        retry_period=dt.timedelta(milliseconds=1),
        clock=clock,
        on_change=changes.append,
    )
    stop = asyncio.Event()
    task = asyncio.ensure_future(elector.run(stop))
    while api.rounds < 5:
        await asyncio.sleep(0.005)
    stop.set()
    elector.release = _no_release  # type: ignore[method-assign]
    await task
    return changes, asked


async def _no_release() -> None:
    return None


async def test_a_lapse_inside_a_slow_renewal_is_reported_as_lost_and_won() -> None:
    # Renewals 2 and 3 each take 6 s: 12 s after renewal 2 began (past the
    # 10 s renew deadline) renewal 3 is still in flight; it then succeeds, 6 s
    # old, so before and after it the loop sees a leader.
    changes, asked = await run_rounds({2: 6.0, 3: 6.0})
    assert asked == [False]  # a worker was told "not leader" meanwhile
    assert changes == [True, False, True]  # ... and hears that it leads again


async def test_renewals_inside_the_deadline_report_nothing_new() -> None:
    changes, asked = await run_rounds({2: 3.0, 3: 3.0})
    assert asked == [True]
    assert changes == [True]


async def test_a_renewal_older_than_the_deadline_is_a_plain_loss() -> None:
    # Renewal 3 itself takes 11 s: the loop sees it is no leader after it.
    changes, asked = await run_rounds({3: 11.0})
    assert asked == [False]
    assert changes[:2] == [True, False]
