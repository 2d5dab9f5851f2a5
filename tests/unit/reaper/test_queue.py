"""The delay queue's guarantees and the token bucket (fake monotonic clocks)."""

from __future__ import annotations

import asyncio
import time

import pytest

from sandman.ratelimit import TokenBucket
from sandman.reaper.workqueue import DelayQueue


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def test_due_order_dedupe_and_earliest_wins() -> None:
    c = Clock()
    q = DelayQueue(c)
    q.add_at("b", 1002)
    q.add_at("a", 1001)
    q.add_at("a", 1005)  # a later time does not postpone the queued one
    assert len(q) == 2
    c.t = 1003
    assert await q.get() == "a"
    assert await q.get() == "b"
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(q.get(), 0.05)


async def test_a_key_is_never_processed_concurrently_with_itself() -> None:
    c = Clock()
    q = DelayQueue(c)
    q.add("k")
    assert await q.get() == "k"
    q.add("k")  # arrives while "k" is processing: held back
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(q.get(), 0.05)
    q.done("k")
    assert await asyncio.wait_for(q.get(), 1) == "k"


async def test_retry_backs_off_and_forget_resets() -> None:
    c = Clock()
    q = DelayQueue(c)
    assert q.retry("k") == pytest.approx(0.05)
    assert q.retry("k") == pytest.approx(0.10)
    q.forget("k")
    assert q.retry("k") == pytest.approx(0.05)


async def test_drop_removes_a_waiting_key() -> None:
    c = Clock()
    q = DelayQueue(c)
    q.add("gone")
    q.drop("gone")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(q.get(), 0.05)


def test_token_bucket() -> None:
    c = Clock()
    b = TokenBucket(rate=2, burst=3, clock=c)
    assert [b.try_take() for _ in range(4)] == [True, True, True, False]
    assert b.wait_time() == pytest.approx(0.5)  # 1 token at 2/s
    c.t += 0.5
    assert b.try_take() and not b.try_take()
    c.t += 100  # refills to the burst, not beyond
    assert sum(b.try_take() for _ in range(10)) == 3


@pytest.mark.parametrize("iterations", [0, 1, 2, 3])
async def test_getters_stop_when_cancelled_while_an_add_wakes_them(iterations: int) -> None:
    # The reaper stopping (its workers cancelled) just as a pod event adds a
    # key: asyncio.wait_for of Python 3.11 swallowed the cancellation and the
    # workers waited for the next due key, an hour away; the process hung.
    q = DelayQueue(time.monotonic)
    q.add_at("far", time.monotonic() + 3600)
    getters = [asyncio.ensure_future(q.get()) for _ in range(8)]
    await asyncio.sleep(0)
    q.add_at("sooner", time.monotonic() + 1800)  # wakes every getter
    for _ in range(iterations):
        await asyncio.sleep(0)
    for g in getters:
        g.cancel()
    done, pending = await asyncio.wait(getters, timeout=5)
    assert not pending and all(g.cancelled() for g in done)
