"""Per-problem sandbox bookkeeping: who may run now, and what can be reused.

Without reuse a problem may always start a rollout (it gets a fresh
sandbox). With reuse it holds at most ``k`` sandboxes: a rollout can start
when one of them is idle (reset and verified) or when the problem is still
short of ``k``; otherwise the dispatcher moves on to the next problem rather
than parking a concurrency slot on a wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sandman.client import Sandbox


@dataclass
class ProblemState:
    index: int
    rollouts: int
    undispatched: int  # rollouts not yet handed a slot
    unserved: int  # rollouts that will still need a sandbox (retries add back)
    live: int = 0  # sandboxes held (idle + in use) or being acquired, reuse only
    acquiring: int = 0  # of ``live``: reserved by a rollout, no pod yet
    idle: list[Sandbox] = field(default_factory=list)
    uses: dict[str, int] = field(default_factory=dict)  # rollouts served, by pod name
    broken: tuple[str, str] | None = None  # (reason, message) of a start error that will recur

    def can_start(self, reuse: bool, k: int) -> bool:
        if self.undispatched <= 0:
            return False
        return not reuse or bool(self.idle) or self.live < k or self.broken is not None

    def want(self, reuse: bool, k: int) -> int:
        """Warm sandboxes this problem could use now (pool target before clipping)."""
        if self.broken is not None:
            return 0
        if not reuse:
            return self.unserved
        held = self.live - self.acquiring
        return max(0, min(k - held, self.unserved - len(self.idle)))
