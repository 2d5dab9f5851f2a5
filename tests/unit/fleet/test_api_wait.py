"""A fleet run waits for the apiserver a bounded time and says what it waits for.

`sandman fleet run` against an apiserver that does not answer retried forever:
the pool manager's first list of pods was awaited without a bound, and pool
plans that failed without an answer were planned again every second, for ever.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from sandman.client.errors import TransportError
from sandman.fleet import fleet as fleet_mod
from sandman.fleet.fleet import Fleet, FleetConfig
from sandman.kube_async import ApiError
from tests.unit.fleet.test_plan_outage import planned_fleet


class NeverSyncs:
    """A pool manager whose first list never arrives (the apiserver is away)."""

    def __init__(self) -> None:
        self.exited = False

    async def __aenter__(self) -> Any:
        await asyncio.Event().wait()

    async def __aexit__(self, *exc: object) -> None:
        self.exited = True


def waiting_fleet(api_wait_s: float) -> tuple[Fleet, NeverSyncs]:
    f = Fleet.__new__(Fleet)
    f.config = FleetConfig(api_wait_s=api_wait_s)
    creds = SimpleNamespace(server="https://10.0.0.1:6443")
    f.client = SimpleNamespace(namespace="team-a", kube=SimpleNamespace(creds=creds))  # type: ignore[assignment]
    pm = NeverSyncs()
    f.pm = pm  # type: ignore[assignment]
    return f, pm


async def test_the_first_list_is_waited_for_a_bounded_time_and_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fleet_mod, "WAIT_NOTICE_S", 0.05)
    f, pm = waiting_fleet(0.3)
    with caplog.at_level(logging.WARNING), pytest.raises(TransportError) as e:
        await asyncio.wait_for(f._start_pools(), 5)
    assert (
        "gave up after 0s waiting for the apiserver at https://10.0.0.1:6443 to list pods "
        "in namespace team-a" in str(e.value)
    )
    assert "--api-wait" in str(e.value)
    assert pm.exited  # its watch and loops are stopped, not left retrying
    assert "waiting up to 0s for the apiserver at https://10.0.0.1:6443" in caplog.text


async def test_plans_failing_longer_than_the_bound_end_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fleet_mod, "PLAN_RETRY_S", 0.01)
    f, _ = planned_fleet([ApiError(503, "unavailable")] * 100)
    f.config = FleetConfig(strategy="pipelined", window=1, api_wait_s=0.2)
    await f._plan()
    assert f.fatal is None  # one failure: planned again
    await asyncio.sleep(0.25)
    await f._plan()
    assert isinstance(f.fatal, TransportError)
    assert "gave up after 0s of failed pool plans" in str(f.fatal)
    assert "unavailable" in str(f.fatal)


async def test_a_plan_that_succeeds_resets_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet_mod, "PLAN_RETRY_S", 0.01)
    f, _ = planned_fleet([ApiError(503, "unavailable")])
    f.config = FleetConfig(strategy="pipelined", window=1, api_wait_s=0.2)
    await f._plan()
    await f._plan()
    assert f.plan_failing_since is None and f.fatal is None


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="api_wait_s"):
        FleetConfig(api_wait_s=0)
