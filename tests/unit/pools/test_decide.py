"""What a claim does to its pool: one phase or two, wait or give up, refill or scale down."""

from __future__ import annotations

import pytest

from sandman.pools.decide import AfterClaim, after_claim, keep_waiting, two_phase_claim


@pytest.mark.parametrize(
    ("target", "replicas", "starting", "failing", "ready_only", "want"),
    [
        # target 4, replicas 4: after the claim 3 are wanted and 4 held; 3 < 4,
        # no use for a refill, every idle pod Ready: hold, scale down, leave.
        (4, 4, 0, 0, False, True),
        # target 0 (demand gone), replicas 2: -1 < 2: two phases.
        (0, 2, 0, 0, False, True),
        # target 5, replicas 4: 4 still wanted after the claim, 4 - 1 < 4 is
        # false at 5 - 1 = 4: the refill is wanted, one write.
        (5, 4, 0, 0, False, False),
        # target 9, replicas 4: a growing pool wants the refill: one write.
        (9, 4, 0, 0, False, False),
        # a pod still starting: the ReplicaSet would pick it, not the held one.
        (4, 4, 1, 0, False, False),
        # a failing pod: likewise (a not-Ready pod is the scale-down pick).
        (4, 4, 0, 1, False, False),
        # ready_only claims stay one write.
        (4, 4, 0, 0, True, False),
    ],
)
def test_two_phase_only_when_no_refill_is_wanted_and_every_idle_pod_is_ready(
    target: int, replicas: int, starting: int, failing: int, ready_only: bool, want: bool
) -> None:
    assert two_phase_claim(target, replicas, starting, failing, ready_only) is want


@pytest.mark.parametrize(
    ("left_s", "replicas", "idle_seen", "want"),
    [
        (1.5, 3, 2, True),  # asked for 3, cache shows 2: the third is on its way
        (1.5, 3, 3, False),  # all it was asked for is seen (and taken): nothing to wait for
        (1.5, 0, 0, False),  # merely wanted, waiting for tokens: do not wait out the budget
        (0.0, 3, 2, False),  # the claimer's wait_s is spent
        (-0.1, 3, 2, False),
    ],
)
def test_wait_only_for_pods_the_replicaset_was_told_to_make(
    left_s: float, replicas: int, idle_seen: int, want: bool
) -> None:
    assert keep_waiting(left_s, replicas, idle_seen) is want


@pytest.mark.parametrize(
    ("target", "replicas", "two_phase", "want"),
    [
        # one phase, target 5, replicas 4: 5 - 1 = 4 still wanted >= 4 held:
        # the ReplicaSet may refill (if a token is free); else scale to
        # min(4, 4 - 1) = 3.
        (5, 4, False, AfterClaim(target=4, refill_if_token=True, scale_to=3)),
        # one phase, target 4, replicas 5 (demand fell): 3 < 5, no refill;
        # scale to min(3, 5 - 1) = 3.
        (4, 5, False, AfterClaim(target=3, refill_if_token=False, scale_to=3)),
        # one phase, target 4, replicas 2 (growing): 3 >= 2, refill; if no
        # token, min(3, 2 - 1) = 1: the claimed pod's place is not kept.
        (4, 2, False, AfterClaim(target=3, refill_if_token=True, scale_to=1)),
        # two phases, target 4, replicas 4: never a refill; min(3, 3) = 3.
        (4, 4, True, AfterClaim(target=3, refill_if_token=False, scale_to=3)),
        # two phases, target 0: demand stays at 0, min(0, 2 - 1) = 0.
        (0, 2, True, AfterClaim(target=0, refill_if_token=False, scale_to=0)),
        # one phase, target 0, replicas 0 (a pod outside the expectation):
        # 0 >= 0 allows a refill; without a token, min(0, -1) = -1, which
        # the manager's scale clips to 0.
        (0, 0, False, AfterClaim(target=0, refill_if_token=True, scale_to=-1)),
    ],
)
def test_after_claim_meets_one_unit_of_demand(
    target: int, replicas: int, two_phase: bool, want: AfterClaim
) -> None:
    assert after_claim(target, replicas, two_phase=two_phase) == want
