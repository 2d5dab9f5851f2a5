"""A delaying work queue: keys come due at a time, deduplicated, one worker per key.

Modeled on client-go's delaying + rate-limited workqueue, as the TTL-after-
finished controller uses it. Guarantees, which the reaper's safety leans on:
a key is never processed concurrently with itself (a key added while being
processed is held back and re-queued when processing ends); adding a key that
is already waiting keeps the earlier due time (an extension re-adds, and the
re-read at processing time decides); failures back off per key. Event-loop
only (not thread-safe).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Callable

# Per-key retry backoff after a failure: 50 ms doubling to 30 s (client-go's
# default item backoff is 5 ms to 1000 s; ours retries API errors, which clear
# within seconds on a local control plane, and must not wait 16 minutes).
BACKOFF_BASE_S = 0.05
BACKOFF_MAX_S = 30.0


class DelayQueue:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, str]] = []
        self._due: dict[str, float] = {}  # key -> the time it is queued for
        self._processing: set[str] = set()
        self._dirty: dict[str, float] = {}  # added while processing
        self._failures: dict[str, int] = {}
        self._seq = itertools.count()
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._due) + len(self._dirty)

    def add_at(self, key: str, when: float) -> None:
        if key in self._processing:
            self._dirty[key] = min(when, self._dirty.get(key, when))
            return
        current = self._due.get(key)
        if current is not None and current <= when:
            return
        self._due[key] = when
        heapq.heappush(self._heap, (when, next(self._seq), key))
        self._wake.set()

    def add(self, key: str) -> None:
        self.add_at(key, self._clock())

    def forget(self, key: str) -> None:
        """Processing succeeded: reset its backoff."""
        self._failures.pop(key, None)

    def retry(self, key: str) -> float:
        """Processing failed: requeue with per-key exponential backoff."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        delay = min(BACKOFF_BASE_S * (2**n), BACKOFF_MAX_S)
        self.add_at(key, self._clock() + delay)
        return delay

    def done(self, key: str) -> None:
        self._processing.discard(key)
        when = self._dirty.pop(key, None)
        if when is not None:
            self.add_at(key, when)

    def drop(self, key: str) -> None:
        """Stop tracking a key (its object is gone)."""
        self._due.pop(key, None)
        self._dirty.pop(key, None)
        self._failures.pop(key, None)

    async def get(self) -> str:
        """The next due key, marked as processing; call done(key) after."""
        while True:
            while self._heap:
                when, _, key = self._heap[0]
                if self._due.get(key) != when:
                    heapq.heappop(self._heap)  # superseded or dropped entry
                    continue
                delay = when - self._clock()
                if delay > 0:
                    break
                heapq.heappop(self._heap)
                del self._due[key]
                self._processing.add(key)
                return key
            self._wake.clear()
            timeout = (self._heap[0][0] - self._clock()) if self._heap else None
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a
            # cancellation that lands while the event it waits on is being set
            # (every getter wakes on one add), and a swallowed cancel kept the
            # reaper's workers, and so the process, from ever stopping.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
