"""Which problems are warm under each strategy, pool sizes, and reuse bookkeeping."""

from __future__ import annotations

import pytest

from sandman.client import Sandbox
from sandman.fleet.fleet import FleetConfig
from sandman.fleet.reuse import ProblemState, sandboxes_per_problem
from sandman.fleet.strategies import STRATEGIES, check, pool_targets, warm_problems

ALL = [4] * 10  # 10 problems, 4 rollouts each, none started


def done_before(front: int, n: int = 10, per: int = 4) -> list[int]:
    """The first ``front`` problems are fully started, the rest untouched."""
    return [0] * front + [per] * (n - front)


# -- check -----------------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_check_accepts_every_strategy_with_a_window(strategy):
    check(strategy, 3)


@pytest.mark.parametrize("strategy", ["none", "naive"])
@pytest.mark.parametrize("window", [0, -1])
def test_window_is_ignored_without_a_window_strategy(strategy, window):
    check(strategy, window)


@pytest.mark.parametrize("strategy", ["sliding", "pipelined"])
@pytest.mark.parametrize("window", [0, -2])
def test_window_strategies_need_a_positive_window(strategy, window):
    with pytest.raises(ValueError, match=rf"{strategy}: window must be >= 1, got {window}"):
        check(strategy, window)


@pytest.mark.parametrize("strategy", ["", "Sliding", "eager", "pipeline"])
def test_unknown_strategy(strategy):
    with pytest.raises(ValueError, match="use one of none, naive, sliding, pipelined"):
        check(strategy, 3)


# -- warm_problems -----------------------------------------------------------------
@pytest.mark.parametrize("remaining", [ALL, done_before(7), [0, 3, 0, 1]])
def test_none_warms_nothing(remaining):
    assert warm_problems("none", 3, remaining) == []
    assert pool_targets("none", 3, remaining) == {}


def test_naive_warms_every_open_problem():
    assert warm_problems("naive", 3, ALL) == list(range(10))
    assert warm_problems("naive", 3, [0, 2, 0, 0, 1, 0, 0, 0, 0, 5]) == [1, 4, 9]


@pytest.mark.parametrize(
    ("remaining", "warm"),
    [
        (ALL, [0, 1, 2]),
        (done_before(1), [1, 2, 3]),
        (done_before(5), [5, 6, 7]),
        (done_before(8), [8, 9]),
        (done_before(9), [9]),
        # the window counts open problems, skipping finished ones behind the front
        ([0, 4, 0, 0, 4, 0, 4, 4, 4, 4], [1, 4, 6]),
        ([1, 0, 0, 0, 0, 0, 0, 0, 0, 1], [0, 9]),
    ],
)
def test_sliding_warms_the_next_window_from_the_front(remaining, warm):
    assert warm_problems("sliding", 3, remaining) == warm


def test_sliding_window_one_and_a_window_larger_than_the_run():
    assert warm_problems("sliding", 1, done_before(4)) == [4]
    assert warm_problems("sliding", 50, done_before(4)) == list(range(4, 10))


@pytest.mark.parametrize(
    ("remaining", "warm"),
    [
        # blocks of 3: {0,1,2} {3,4,5} {6,7,8} {9}
        (ALL, [0, 1, 2, 3, 4, 5]),  # block 0 runs, block 1 warms
        (done_before(1), [1, 2, 3, 4, 5]),  # same blocks while the front is in block 0
        (done_before(2), [2, 3, 4, 5]),
        (done_before(3), [3, 4, 5, 6, 7, 8]),  # front enters block 1: block 2 starts warming
        (done_before(5), [5, 6, 7, 8]),
        (done_before(6), [6, 7, 8, 9]),
        (done_before(7), [7, 8, 9]),
        (done_before(9), [9]),  # the last (short) block, nothing after it
        # a finished problem inside a block does not move the blocks
        ([4, 0, 4, 4, 0, 4, 4, 4, 4, 4], [0, 2, 3, 5]),
        # the front jumps over an empty block: front block is 2, warm 2 and 3
        ([0, 0, 0, 0, 0, 0, 0, 4, 4, 4], [7, 8, 9]),
        ([0, 0, 0, 0, 0, 0, 4, 0, 0, 4], [6, 9]),
        # a straggler far ahead of the front is not warmed early
        ([0, 2, 0, 0, 0, 0, 0, 0, 0, 1], [1]),
    ],
)
def test_pipelined_warms_the_front_block_and_the_next(remaining, warm):
    assert warm_problems("pipelined", 3, remaining) == warm


def test_pipelined_differs_from_sliding_within_a_block():
    # sliding moves one problem at a time; pipelined holds its blocks until the front crosses
    r = done_before(1)
    assert warm_problems("sliding", 3, r) == [1, 2, 3]
    assert warm_problems("pipelined", 3, r) == [1, 2, 3, 4, 5]


def test_pipelined_window_one_is_front_and_next():
    assert warm_problems("pipelined", 1, ALL) == [0, 1]
    assert warm_problems("pipelined", 1, [0, 0, 3, 0, 2]) == [2]  # 3 is done; 4 is two blocks on


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_nothing_is_warm_when_the_run_is_done(strategy):
    assert warm_problems(strategy, 3, [0] * 10) == []
    assert warm_problems(strategy, 3, []) == []
    assert pool_targets(strategy, 3, [0] * 10) == {}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_negative_remaining_counts_as_done(strategy):
    assert warm_problems(strategy, 3, [-1, 0, -5]) == []


# -- pool_targets ---------------------------------------------------------------
def test_targets_default_to_rollouts_not_yet_started():
    remaining = [0, 0, 1, 4, 2, 4, 4, 4, 4, 4]
    assert pool_targets("sliding", 3, remaining) == {2: 1, 3: 4, 4: 2}
    assert pool_targets("naive", 3, remaining) == {i: remaining[i] for i in range(2, 10)}
    assert pool_targets("pipelined", 3, remaining) == {2: 1, 3: 4, 4: 2, 5: 4}


def test_want_caps_the_target():
    remaining = [4, 4, 4, 4]
    want = [2, 0, 9, 4]  # reuse: short of k by 2; full; more than remains; exactly
    assert pool_targets("naive", 3, remaining, want=want) == {0: 2, 1: 0, 2: 4, 3: 4}


def test_want_never_makes_a_target_negative():
    assert pool_targets("naive", 3, [3, 3], want=[-2, 1]) == {0: 0, 1: 1}


def test_want_does_not_decide_which_problems_are_warm():
    # a problem with want 0 keeps its (empty) pool; a closed one gets none whatever it wants
    assert pool_targets("sliding", 2, [0, 5, 5, 5], want=[7, 0, 3, 3]) == {1: 0, 2: 3}


# -- reuse bookkeeping ------------------------------------------------------------
def sandbox(name: str = "p-1") -> Sandbox:
    return Sandbox(None, {"metadata": {"name": name, "namespace": "ns"}})  # type: ignore[arg-type]


def state(**kw) -> ProblemState:
    base = {"index": 0, "rollouts": 8, "undispatched": 8, "unserved": 8}
    return ProblemState(**{**base, **kw})


BROKEN = ("ImageNotFound", "manifest unknown")


@pytest.mark.parametrize("reuse", [False, True])
def test_nothing_to_start_when_all_dispatched(reuse):
    s = state(undispatched=0, unserved=2, live=0, idle=[sandbox()], broken=BROKEN)
    assert not s.can_start(reuse, k=2)
    s = state(undispatched=-1)
    assert not s.can_start(reuse, k=2)


def test_without_reuse_a_rollout_can_always_start():
    assert state(live=10).can_start(reuse=False, k=1)
    assert state(undispatched=1, live=0).can_start(reuse=False, k=0)


def test_with_reuse_start_when_idle_or_short_of_k():
    assert state(live=0).can_start(reuse=True, k=2)
    assert state(live=1).can_start(reuse=True, k=2)
    assert not state(live=2).can_start(reuse=True, k=2)  # all k busy: move on
    assert not state(live=3).can_start(reuse=True, k=2)
    assert state(live=2, idle=[sandbox()]).can_start(reuse=True, k=2)


def test_with_reuse_a_broken_problem_may_start_to_fail_fast():
    assert state(live=2, broken=BROKEN).can_start(reuse=True, k=2)


def test_want_without_reuse_is_unserved():
    assert state(unserved=5, live=3).want(reuse=False, k=2) == 5
    assert state(unserved=0).want(reuse=False, k=2) == 0


@pytest.mark.parametrize(
    ("unserved", "live", "k", "want"),
    [
        (8, 0, 2, 2),  # short of k
        (8, 1, 2, 1),
        (8, 2, 2, 0),  # has k
        (8, 3, 2, 0),  # over k: never negative
        (1, 0, 2, 1),  # fewer rollouts left than k
        (1, 1, 2, 1),  # the one held is busy; live < k, so the last rollout gets a new one
        (3, 1, 4, 3),
        (0, 0, 2, 0),
    ],
)
def test_want_with_reuse_is_the_shortfall_of_k(unserved, live, k, want):
    assert state(unserved=unserved, live=live).want(reuse=True, k=k) == want


@pytest.mark.parametrize("reuse", [False, True])
def test_broken_problem_wants_no_pool(reuse):
    assert state(unserved=8, live=0, broken=BROKEN).want(reuse, k=4) == 0


def test_idle_sandboxes_do_not_change_want():
    # idle ones are counted in live already; want is about new sandboxes
    assert state(unserved=8, live=2, idle=[sandbox("a"), sandbox("b")]).want(True, k=3) == 1


def test_a_reservation_still_waiting_for_its_pod_is_wanted():
    # dispatched with a reservation (live counts it) but no pod yet: the pool
    # must still offer one, or the rollout would have nothing to claim
    s = state(unserved=3, live=1)
    s.acquiring = 1
    assert s.want(True, k=1) == 1
    s.acquiring, s.unserved = 0, 2  # got its pod
    assert s.want(True, k=1) == 0


@pytest.mark.parametrize(
    ("k", "concurrency", "problems", "rollouts", "want"),
    [
        (0, 64, 100, 8, 1),  # more problems than slots: one sandbox each
        (0, 64, 64, 8, 1),
        (0, 64, 20, 8, 4),  # 20 x 4 = 80 >= 64: every slot can be filled
        (0, 16, 12, 8, 2),
        (0, 64, 2, 8, 8),  # never more sandboxes than rollouts
        (0, 4, 0, 8, 4),  # no problems: nothing divides by zero
        (0, 4, 3, 0, 1),
        (2, 64, 100, 8, 2),  # set by the caller: kept
        (5, 4, 100, 1, 5),
    ],
)
def test_sandboxes_per_problem(k: int, concurrency: int, problems: int, rollouts: int, want: int):
    assert sandboxes_per_problem(k, concurrency, problems, rollouts) == want


def test_fleet_config_k():
    assert FleetConfig().k == 0  # automatic by default
    FleetConfig(k=3)
    with pytest.raises(ValueError, match="k must be"):
        FleetConfig(k=-1)
