"""Per-problem sandbox bookkeeping: who may run now, and what can be reused (pure).

Without reuse a problem may always start a rollout (it gets a fresh
sandbox). With reuse it holds at most ``k`` sandboxes: a rollout can start
when one of them is idle (reset and verified) or when the problem is still
short of ``k``; otherwise the dispatcher moves on to the next problem rather
than parking a concurrency slot on a wait.

The counts change only through the named transitions below, one per event
of a rollout's life, so that every path through the fleet moves them the
same way (the fleet does the I/O and calls them):

- dispatched for a new sandbox (reuse): ``reserve``; it gets one:
  ``acquired`` (undone by ``lost`` if that sandbox does not come up); it
  gives its place back without one: ``unreserve``;
- served by an idle sandbox of the problem: ``reused``;
- a sandbox of the problem released: ``dropped``;
- the task hit an infrastructure error: ``needs_another``;
- the rollout ends without a result: ``gave_up``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sandman.client import Sandbox


def sandboxes_per_problem(k: int, concurrency: int, problems: int, rollouts: int) -> int:
    """The ``k`` a run uses: ``k`` itself when set (>= 1), else (0, automatic)
    the fewest sandboxes per problem that still let the run fill its
    concurrency: ``ceil(concurrency / problems)``, between 1 and ``rollouts``.

    Every sandbox beyond that is one more pod start bought for a slot that a
    sandbox of another problem would have filled anyway.

    >>> sandboxes_per_problem(0, 64, 100, 8)   # more problems than slots: one each
    1
    >>> sandboxes_per_problem(0, 64, 20, 8)    # 20 problems, 64 slots: 4 each
    4
    >>> sandboxes_per_problem(0, 64, 2, 8)     # never more than the rollouts
    8
    >>> sandboxes_per_problem(3, 64, 100, 8)   # set by the caller: kept
    3
    """
    if k >= 1:
        return k
    per = -(-concurrency // max(1, problems))
    return max(1, min(per, max(1, rollouts)))


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

    # -- transitions ---------------------------------------------------------------
    def reserve(self) -> None:
        """(reuse) A rollout will get a new sandbox: it counts toward ``k`` from
        now, without a pod yet, so ``want`` keeps asking the pool for one."""
        self.live += 1
        self.acquiring += 1

    def unreserve(self) -> None:
        """(reuse) A reserved rollout gives its place back without a sandbox."""
        self.live -= 1
        self.acquiring -= 1

    def acquired(self, reuse: bool) -> None:
        """A new sandbox (claimed or created) is the rollout's: its demand is met
        and, with reuse, its reservation has its pod."""
        self.unserved -= 1
        if reuse:
            self.acquiring -= 1

    def lost(self, reuse: bool) -> None:
        """The sandbox just acquired did not come up: undoes ``acquired``."""
        self.unserved += 1
        if reuse:
            self.acquiring += 1

    def reused(self) -> None:
        """An idle sandbox of the problem (reset, verified) serves the rollout."""
        self.unserved -= 1

    def dropped(self, reuse: bool) -> None:
        """A sandbox of the problem is released (rotated, dirty, or failed)."""
        if reuse:
            self.live -= 1

    def needs_another(self) -> None:
        """The task hit an infrastructure error: its rollout needs a sandbox again."""
        self.unserved += 1

    def gave_up(self) -> None:
        """The rollout ends without a result (infrastructure failure): it will
        not need a sandbox any more."""
        self.unserved -= 1
