"""A token bucket (pure; the clock is injected)."""

from __future__ import annotations

from collections.abc import Callable


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up.

    Not thread-safe; one event loop only.
    """

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = float(burst)
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def try_take(self) -> bool:
        self._refill()
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False

    def wait_time(self) -> float:
        """Seconds until a token is available (0 if one is)."""
        self._refill()
        return max(0.0, (1 - self._tokens) / self.rate)
