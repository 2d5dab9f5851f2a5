"""What a claim does to its pool (pure: the pool's counts in, a decision out).

A claim meets one unit of a pool's demand (its ``target``: idle pods
wanted). ``replicas`` is what the manager last wrote to the ReplicaSet, its
expectation of how many pods the pool holds. Three decisions, each made
where the manager stands at that moment (PoolManager.claim does the I/O):

1. Before the claim: one phase or two. If the pool has no use for a
   replacement (``target - 1 < replicas``) the claim is two-phase: hold the
   pod, scale the pool down (the ReplicaSet's pick is the held pod, which the
   webhook refuses to let it delete), then leave the pool: no refill is ever
   created. The ReplicaSet picks not-Ready pods first, so this needs every
   idle pod Ready; otherwise the claim is one write and an unwanted refill is
   cancelled by a scale-down after the fact (the ReplicaSet has often created
   the replacement by then). ``ready_only`` claims stay one-phase.
2. When no pod is idle: wait for the pool, or give up now. Waiting pays only
   for pods the ReplicaSet was told to make and that the cache has not shown
   yet; a pool that is merely wanted (its growth waiting for tokens) would
   make the claimer wait out its whole budget for nothing.
3. After the claim: the new demand, and whether the ReplicaSet may refill.
   A one-phase claim lets it refill when demand still covers the pool and a
   token is free (the token pays for the refill); otherwise the pool is
   scaled down by one so the refill waits for the manager's loop.
"""

from __future__ import annotations

from dataclasses import dataclass


def two_phase_claim(
    target: int, replicas: int, starting: int, failing: int, ready_only: bool
) -> bool:
    """Claim in two phases (hold, scale down, leave): the pool wants no refill
    and the ReplicaSet's scale-down pick is sure to be the held pod."""
    return target - 1 < replicas and starting == 0 and failing == 0 and not ready_only


def keep_waiting(left_s: float, replicas: int, idle_seen: int) -> bool:
    """After NoIdlePod: wait for the pool's next pod (it has been asked for but
    not seen yet) while the claimer's ``wait_s`` lasts."""
    return left_s > 0 and replicas > idle_seen


@dataclass(frozen=True)
class AfterClaim:
    target: int  # the pool's demand once the claim has met one unit of it
    refill_if_token: bool  # one-phase: let the ReplicaSet refill if a token is free now
    scale_to: int  # replicas to write when the pool must not refill


def after_claim(target: int, replicas: int, *, two_phase: bool) -> AfterClaim:
    """The pool's new demand and its size after a claim.

    A two-phase claim always scales down to ``scale_to`` before the pod leaves;
    a one-phase claim does when ``refill_if_token`` is false or no token is free.
    ``scale_to`` never exceeds the new demand nor keeps the claimed pod's place.
    """
    left = max(0, target - 1)
    return AfterClaim(
        target=left,
        refill_if_token=not two_phase and left >= replicas,
        scale_to=min(left, replicas - 1),
    )
