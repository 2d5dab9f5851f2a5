"""A problem's counts move only through named transitions, the same on every path."""

from __future__ import annotations

from typing import Any

from sandman.fleet.reuse import ProblemState


def state(**kw: Any) -> ProblemState:
    base = {"index": 0, "rollouts": 4, "undispatched": 4, "unserved": 4}
    return ProblemState(**{**base, **kw})


def counts(s: ProblemState) -> tuple[int, int, int]:
    return s.unserved, s.live, s.acquiring


def test_a_reservation_counts_toward_k_until_given_back() -> None:
    s = state()
    s.reserve()
    assert counts(s) == (4, 1, 1)
    assert not s.can_start(reuse=True, k=1)  # its one sandbox is spoken for
    assert s.want(reuse=True, k=1) == 1  # ... but has no pod yet: the pool offers one
    s.unreserve()
    assert counts(s) == (4, 0, 0)
    assert s.can_start(reuse=True, k=1)


def test_a_dropped_sandbox_frees_a_place_only_with_reuse() -> None:
    s = state(live=2)
    s.dropped(reuse=False)
    assert s.live == 2  # without reuse live is not kept
    s.dropped(reuse=True)
    assert s.live == 1


def test_a_reused_sandbox_serves_without_a_reservation() -> None:
    s = state(live=1)  # its sandbox was idle; the dispatcher took it
    s.reused()
    assert counts(s) == (3, 1, 0)


def test_an_infrastructure_error_in_the_task_puts_the_rollout_back_until_it_gives_up() -> None:
    s = state(unserved=3)  # one rollout already has its sandbox
    s.needs_another()  # the sandbox died under the task
    assert s.unserved == 4
    s.gave_up()  # out of attempts: it will not need one any more
    assert s.unserved == 3


def test_a_reserved_rollout_that_gets_its_sandbox_stops_asking_the_pool() -> None:
    # k = 1, reuse: reserve (live 1, acquiring 1, want 1: the pool offers a
    # pod); acquired: unserved 4 - 1 = 3, acquiring 0, held = live - acquiring
    # = 1 = k, so want = max(0, min(k - held, ...)) = 0: nothing more to warm.
    s = state()
    s.reserve()
    s.acquired(reuse=True)
    assert counts(s) == (3, 1, 0)
    assert s.want(reuse=True, k=1) == 0
    # the rollout is done and the sandbox rotated out: the problem is short
    # of k again, for its 3 remaining rollouts: want = min(1 - 0, 3) = 1.
    s.dropped(reuse=True)
    assert counts(s) == (3, 0, 0)
    assert s.want(reuse=True, k=1) == 1


def test_every_path_through_a_rollout_leaves_the_counts_balanced() -> None:
    # reuse, k = 2: four rollouts, each ending differently; at the end the
    # problem holds nothing and needs nothing.
    s = state()
    # 1. acquired, ran, sandbox kept idle, then dropped at the end of the run
    s.reserve()
    s.acquired(reuse=True)
    # 2. acquired a sandbox that never came up (lost), retried and got one
    s.reserve()
    s.acquired(reuse=True)
    s.lost(reuse=True)
    s.unreserve()  # the failed attempt gives its place back ...
    s.reserve()  # ... and the retry takes a new one
    s.acquired(reuse=True)
    # 3. served by rollout 1's idle sandbox; the task's infrastructure error
    #    kills it (needs_another, dropped); out of attempts: gave_up
    s.reused()
    s.needs_another()
    s.dropped(reuse=True)
    s.gave_up()
    # 4. the problem broke before it started: its reservation is given back
    s.reserve()
    s.unreserve()
    s.gave_up()
    # the sandbox of rollout 2 is released at the end
    s.dropped(reuse=True)
    assert counts(s) == (0, 0, 0)
