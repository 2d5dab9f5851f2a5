"""Warm pools without a CRD: a pool is a ReplicaSet of idle sandbox pods.

A claim is one JSON patch that flips the state label from ``idle`` to
``claimed`` (guarded by a ``test`` op) and drops the ReplicaSet's owner
reference, so the pod leaves the pool atomically and the ReplicaSet refills.
"""

from __future__ import annotations

from sandman.pools.claim import ClaimResult, NoIdlePod, claim, claim_patch
from sandman.pools.spec import PoolSpec, pool_selector, replicaset_name

__all__ = [
    "ClaimResult",
    "NoIdlePod",
    "PoolSpec",
    "claim",
    "claim_patch",
    "pool_selector",
    "replicaset_name",
]
