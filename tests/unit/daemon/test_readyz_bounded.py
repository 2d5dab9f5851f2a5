"""GET /readyz runs the container's own probe at most once per period, never twice at once.

/readyz takes no token, so without the bound anyone who reaches the pod can
make the daemon fork the image's probe command as fast as they can send
requests.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandman.daemon.readiness import DEFAULT_PERIOD_S, Probe, SharedCheck, fresh
from tests.unit.daemon.helpers import start_daemon, stop_daemon


def _counting_probe(tmp_path: Path, **extra: int) -> tuple[Path, str]:
    runs = tmp_path / "runs"
    # Each run leaves one line; the sleep keeps a run in flight while the
    # other requests arrive, so sharing the run is what is tested.
    cmd = f"echo run >> {runs}; sleep 0.3"
    return runs, json.dumps({"exec": {"command": ["sh", "-c", cmd]}, **extra})


def _runs(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_flood_of_readyz_calls_runs_the_probe_once_per_period(tmp_path: Path) -> None:
    runs, probe = _counting_probe(tmp_path, periodSeconds=60)
    d = start_daemon(tmp_path, f"--readiness-probe={probe}")
    try:
        with ThreadPoolExecutor(50) as pool:
            answers = list(pool.map(lambda _: d.request("GET", "/readyz", token=""), range(50)))
        assert all(a == (200, {"ready": True, "reason": "exec probe exited 0"}) for a in answers)
        # 50 concurrent callers, one run; and a second wave within the period
        # is answered from the cache.
        assert _runs(runs) == 1
        with ThreadPoolExecutor(10) as pool:
            list(pool.map(lambda _: d.request("GET", "/readyz", token=""), range(10)))
        assert _runs(runs) == 1
    finally:
        stop_daemon(d)


def test_readyz_runs_the_probe_again_once_the_period_is_over(tmp_path: Path) -> None:
    runs, probe = _counting_probe(tmp_path, periodSeconds=1)
    d = start_daemon(tmp_path, f"--readiness-probe={probe}")
    try:
        assert d.request("GET", "/readyz", token="")[0] == 200
        assert _runs(runs) == 1
        # The period (1 s) counts from the run's start; the run took 0.3 s.
        time.sleep(0.8)
        assert d.request("GET", "/readyz", token="")[0] == 200
        assert _runs(runs) == 2
    finally:
        stop_daemon(d)


# -- the cache on its own, with an injected clock -----------------------------------
def test_period_is_parsed_with_the_kubelets_default() -> None:
    assert Probe.from_json({"exec": {"command": ["true"]}}).period_s == DEFAULT_PERIOD_S == 10
    assert Probe.from_json({"exec": {"command": ["true"]}, "periodSeconds": 3}).period_s == 3
    for bad in (0, -1, "5", True):
        with pytest.raises(ValueError, match="periodSeconds"):
            Probe.from_json({"exec": {"command": ["true"]}, "periodSeconds": bad})


@pytest.mark.parametrize(
    ("last_at", "now", "fresh_"),
    [
        (None, 100.0, False),  # never probed
        (100.0, 100.0, True),  # 0 s old < 10
        (100.0, 109.999, True),  # 9.999 s old < 10
        (100.0, 110.0, False),  # 10 s old: the period is over
        (100.0, 99.0, False),  # the clock went back: do not trust the cache
    ],
)
def test_fresh(last_at: float | None, now: float, fresh_: bool) -> None:
    assert fresh(last_at, now, 10.0) is fresh_


async def test_concurrent_callers_share_one_run_and_the_period_counts_from_its_start() -> None:
    now = [1000.0]
    shared = SharedCheck(clock=lambda: now[0])
    release = asyncio.Event()
    calls = 0

    async def run() -> tuple[bool, str]:
        nonlocal calls
        calls += 1
        await release.wait()
        now[0] += 4  # the run takes 4 s
        return True, f"run {calls}"

    callers = [asyncio.ensure_future(shared.outcome(10, run)) for _ in range(50)]
    await asyncio.sleep(0)
    # One caller goes away mid-run: the others still get the outcome.
    callers[0].cancel()
    release.set()
    outcomes = await asyncio.gather(*callers[1:])
    assert calls == 1 and set(outcomes) == {(True, "run 1")}
    # Started at 1000, now 1004: cached until 1010.
    now[0] = 1009.9
    assert await shared.outcome(10, run) == (True, "run 1") and calls == 1
    now[0] = 1010.0
    assert await shared.outcome(10, run) == (True, "run 2") and calls == 2


async def test_a_run_that_raises_does_not_wedge_the_next() -> None:
    shared = SharedCheck(clock=lambda: 0.0)

    async def boom() -> tuple[bool, str]:
        raise RuntimeError("probe machinery broke")

    async def ok() -> tuple[bool, str]:
        return True, "ok"

    with pytest.raises(RuntimeError):
        await shared.outcome(10, boom)
    assert await shared.outcome(10, ok) == (True, "ok")
