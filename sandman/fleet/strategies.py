"""Which problems get a warm pool, and how big, at each point of a run (pure).

Rollouts are handed out problem by problem, so the "front" (the first
problem with rollouts not yet started) marks where the run is.

- ``none``: no pools; every sandbox is created when its rollout starts.
- ``naive``: warm everything at once: a pool for every problem.
- ``sliding``: pools for the next ``window`` problems from the front; a
  problem's pool is made only when it enters that window.
- ``pipelined``: problems in blocks of ``window``; the block the front is in
  runs while the next block warms, so a block is warm before its turn.

A pool's size is what its problem still needs: its rollouts not yet started,
or with reuse, the sandboxes it is short of ``k``.
"""

from __future__ import annotations

from collections.abc import Sequence

STRATEGIES = ("none", "naive", "sliding", "pipelined")


def check(strategy: str, window: int) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    if strategy in ("sliding", "pipelined") and window < 1:
        raise ValueError(f"{strategy}: window must be >= 1, got {window}")


def warm_problems(strategy: str, window: int, remaining: Sequence[int]) -> list[int]:
    """Indexes of problems that should have a pool now."""
    open_ = [i for i, n in enumerate(remaining) if n > 0]
    if strategy == "none" or not open_:
        return []
    if strategy == "naive":
        return open_
    if strategy == "sliding":
        return open_[:window]
    block = open_[0] // window  # pipelined
    return [i for i in open_ if i // window in (block, block + 1)]


def pool_targets(
    strategy: str,
    window: int,
    remaining: Sequence[int],
    *,
    want: Sequence[int] | None = None,
) -> dict[int, int]:
    """Idle pods each warm problem's pool should hold.

    ``want[i]`` caps it (with reuse: the sandboxes problem i is short of);
    by default a problem wants one sandbox per rollout not yet started.
    """
    caps = remaining if want is None else want
    return {
        i: max(0, min(remaining[i], caps[i])) for i in warm_problems(strategy, window, remaining)
    }
