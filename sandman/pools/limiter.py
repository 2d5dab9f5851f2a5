"""One create budget for everything a process creates, with two priorities.

A token bucket shared by all pools and all on-demand creates: a hundred
pools each allowed "10/s" would be 1000 creates/s at the apiserver, which is
exactly the flood this exists to prevent. On-demand creates (a rollout is
waiting for that very pod) wait in line and are served first; refills (warm
pods for later) only take a token when nobody is waiting, and never wait.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

from sandman.ratelimit import TokenBucket


class CreateLimiter:
    """Event-loop only."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.bucket = TokenBucket(rate, burst, clock)
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._pump: asyncio.Task[None] | None = None
        self.granted = {"on_demand": 0, "refill": 0}

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiters if not f.done())

    async def acquire(self) -> None:
        """For an on-demand create: wait for a token, ahead of every refill."""
        if not self._waiters and self.bucket.try_take():
            self.granted["on_demand"] += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        if self._pump is None or self._pump.done():
            self._pump = asyncio.create_task(self._serve())
        await fut

    def try_refill(self) -> bool:
        """For a refill: a token now, or no (on-demand waiters come first)."""
        if self.waiting or not self.bucket.try_take():
            return False
        self.granted["refill"] += 1
        return True

    async def _serve(self) -> None:
        while self._waiters:
            fut = self._waiters[0]
            if fut.done():  # its waiter was cancelled
                self._waiters.popleft()
                continue
            if self.bucket.try_take():
                self._waiters.popleft()
                self.granted["on_demand"] += 1
                fut.set_result(None)
            else:
                await asyncio.sleep(self.bucket.wait_time())

    def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
        for fut in self._waiters:
            if not fut.done():
                fut.cancel()
