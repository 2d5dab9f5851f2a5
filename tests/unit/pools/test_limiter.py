"""The shared create budget: on-demand creates first, refills never wait.

A fake clock drives the token bucket; the limiter's pump still sleeps on the
real event loop (for the bucket's wait_time, a few milliseconds here), so the
async tests poll for outcomes with generous deadlines and assert on order and
counts, never on tight timings.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from sandman.pools.limiter import CreateLimiter

RATE = 64.0  # 1/64 s is exact in binary, so advancing the fake clock adds exact tokens
TICK = 1 / RATE


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def eventually(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.005)


async def settle() -> None:
    """Long enough for the pump to wake from a wait_time sleep (<= 1/RATE)."""
    await asyncio.sleep(10 * TICK)


# -- refills (sync) ------------------------------------------------------------
def test_refills_take_the_burst_then_follow_the_rate():
    clock = FakeClock()
    lim = CreateLimiter(RATE, burst=3, clock=clock)
    assert [lim.try_refill() for _ in range(4)] == [True, True, True, False]
    clock.advance(TICK / 2)
    assert not lim.try_refill()
    clock.advance(TICK / 2)
    assert lim.try_refill()
    assert not lim.try_refill()
    clock.advance(10.0)  # a long quiet spell saves up at most the burst
    assert [lim.try_refill() for _ in range(4)] == [True, True, True, False]
    assert lim.granted == {"on_demand": 0, "refill": 7}


def test_a_failed_refill_costs_nothing():
    clock = FakeClock()
    lim = CreateLimiter(RATE, burst=1, clock=clock)
    assert lim.try_refill()
    for _ in range(5):
        assert not lim.try_refill()
    assert lim.granted["refill"] == 1
    clock.advance(TICK)
    assert lim.try_refill()


def test_invalid_rate_or_burst():
    with pytest.raises(ValueError):
        CreateLimiter(0, 1)
    with pytest.raises(ValueError):
        CreateLimiter(1, 0)


# -- on-demand (async) ---------------------------------------------------------
async def test_acquire_takes_a_free_token_at_once():
    clock = FakeClock()
    lim = CreateLimiter(RATE, burst=2, clock=clock)
    await asyncio.wait_for(lim.acquire(), 1)
    await asyncio.wait_for(lim.acquire(), 1)
    assert lim.granted == {"on_demand": 2, "refill": 0}
    assert lim.waiting == 0
    assert not lim.try_refill()  # the burst is spent


async def test_waiting_acquire_is_served_before_refills():
    clock = FakeClock()
    lim = CreateLimiter(RATE, burst=1, clock=clock)
    assert lim.try_refill()  # spend the only token
    task = asyncio.create_task(lim.acquire())
    await settle()
    assert not task.done()
    assert lim.waiting == 1

    clock.advance(TICK)  # a token is there now, but it is the waiter's
    assert not lim.try_refill()
    await eventually(task.done)
    await task
    assert lim.waiting == 0
    assert lim.granted == {"on_demand": 1, "refill": 1}
    assert not lim.try_refill()  # the waiter took it
    clock.advance(TICK)
    assert lim.try_refill()  # no waiters: refills get tokens again
    lim.close()


async def test_waiters_are_served_in_order_one_token_each():
    clock = FakeClock()
    lim = CreateLimiter(RATE, burst=1, clock=clock)
    await lim.acquire()  # spend the token
    done: list[int] = []

    async def one(i: int) -> None:
        await lim.acquire()
        done.append(i)

    tasks = [asyncio.create_task(one(i)) for i in range(3)]
    await settle()
    assert done == []
    assert lim.waiting == 3
    for served in range(1, 4):
        clock.advance(TICK)
        await eventually(lambda n=served: len(done) == n)
        await settle()
        assert len(done) == served  # one token, one waiter: the rate holds
        assert lim.waiting == 3 - served
        assert not lim.try_refill()  # spent by the waiter, or reserved for the rest
    assert done == [0, 1, 2]
    await asyncio.gather(*tasks)
    assert lim.granted == {"on_demand": 4, "refill": 0}
    lim.close()


async def test_new_acquire_queues_behind_existing_waiters():
    clock = FakeClock()
    lim = CreateLimiter(RATE, burst=2, clock=clock)
    lim.try_refill()
    lim.try_refill()
    order: list[str] = []

    async def one(tag: str) -> None:
        await lim.acquire()
        order.append(tag)

    first = asyncio.create_task(one("first"))
    await settle()
    # A token arrives; a newcomer must not overtake the waiter via the fast path.
    clock.advance(TICK)
    second = asyncio.create_task(one("second"))
    await eventually(lambda: len(order) == 1)
    clock.advance(TICK)
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert order == ["first", "second"]
    lim.close()


async def test_cancelled_waiter_frees_its_place():
    clock = FakeClock()
    lim = CreateLimiter(RATE, burst=1, clock=clock)
    assert lim.try_refill()
    gone = asyncio.create_task(lim.acquire())
    stays = asyncio.create_task(lim.acquire())
    await settle()
    assert lim.waiting == 2
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert lim.waiting == 1
    clock.advance(TICK)
    await asyncio.wait_for(stays, 5)  # the cancelled one did not take the token
    assert lim.granted["on_demand"] == 1
    assert lim.waiting == 0
    clock.advance(TICK)
    assert lim.try_refill()
    lim.close()


async def test_close_cancels_waiters():
    clock = FakeClock()
    lim = CreateLimiter(RATE, burst=1, clock=clock)
    assert lim.try_refill()
    task = asyncio.create_task(lim.acquire())
    await settle()
    lim.close()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert lim.waiting == 0


async def test_real_clock_priority_and_rate():
    """Real time, 50/s, burst 1: refills get nothing while on-demand creates wait."""
    lim = CreateLimiter(50, burst=1)
    start = time.monotonic()
    tasks = [asyncio.create_task(lim.acquire()) for _ in range(4)]
    refills_while_waiting = 0
    while not all(t.done() for t in tasks):
        if lim.waiting:
            refills_while_waiting += lim.try_refill()
        await asyncio.sleep(0.002)
        assert time.monotonic() - start < 10
    elapsed = time.monotonic() - start
    assert refills_while_waiting == 0
    assert lim.granted["on_demand"] == 4
    assert lim.granted["refill"] == 0
    # one token up front, three more at 50/s: at least ~60 ms (a generous floor)
    assert elapsed >= 0.04
    lim.close()
