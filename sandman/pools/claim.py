"""Claiming a warm pod: one JSON patch that only one client can win.

The patch tests that the pod is still ``idle`` (and is the pod we looked at,
by UID), flips it to ``claimed``, stamps who and when, sets the lease, and
removes the ReplicaSet's owner reference. The apiserver applies a JSON patch
to the latest object inside its optimistic-concurrency loop, so of two racing
claimers exactly one sees ``idle``; the other gets 422 and tries another pod.
Dropping the owner reference in the same patch matters: if the pool is
deleted right after a claim, the garbage collector must not take the claimed
pod with it (the ReplicaSet controller would release it too, but later).
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sandman.client import startup
from sandman.contract import ANN_EXPIRES_AT, LABEL_STATE, format_time
from sandman.kube_async import JSON_PATCH, PODS, ApiError, KubeClient, escape_pointer, list_all
from sandman.pools.spec import (
    ANN_CLAIMED_AT,
    ANN_CLAIMED_BY,
    STATE_CLAIMED,
    STATE_IDLE,
    pool_selector,
)

# Losing a race costs one round trip; after this many lost races in one call
# the candidates list is stale enough that a fresh list is cheaper.
MAX_TRIES_PER_LIST = 8


class NoIdlePod(Exception):
    """The pool has no idle pod to claim right now (it may be refilling)."""


@dataclass
class ClaimResult:
    pod: dict[str, Any]
    conflicts: int  # races lost before this win
    ready: bool  # claimed Ready (warm) rather than still starting


def _label(key: str) -> str:
    return "/metadata/labels/" + escape_pointer(key)


def _ann(key: str) -> str:
    return "/metadata/annotations/" + escape_pointer(key)


def claim_patch(
    pod: dict[str, Any], *, claimer: str, now: dt.datetime, ttl: dt.timedelta
) -> list[dict[str, Any]]:
    md = pod["metadata"]
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/uid", "value": md["uid"]},
        {"op": "test", "path": _label(LABEL_STATE), "value": STATE_IDLE},
        # null tests for absence (the apiserver's json-patch): never claim a
        # pod the ReplicaSet is already deleting (e.g. after a scale-down).
        {"op": "test", "path": "/metadata/deletionTimestamp", "value": None},
        {"op": "replace", "path": _label(LABEL_STATE), "value": STATE_CLAIMED},
    ]
    if not md.get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    ops += [
        {"op": "add", "path": _ann(ANN_CLAIMED_BY), "value": claimer},
        {"op": "add", "path": _ann(ANN_CLAIMED_AT), "value": format_time(now)},
        {"op": "add", "path": _ann(ANN_EXPIRES_AT), "value": format_time(now + ttl)},
    ]
    refs = md.get("ownerReferences") or []
    if refs:
        # Test the exact list we saw, so a concurrent owner change fails the claim
        # instead of us dropping a reference we never looked at.
        ops += [
            {"op": "test", "path": "/metadata/ownerReferences", "value": refs},
            {"op": "remove", "path": "/metadata/ownerReferences"},
        ]
    return ops


def rank(pods: Sequence[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """Claim order: Ready pods first (shuffled, so many claimers spread out
    instead of all racing for the first one), then pods still starting, oldest
    first (closest to Ready), then pods in trouble that may yet start (e.g. a
    pull in back-off). Pods that are terminating or can never start are left
    alone."""
    ready, starting, troubled = [], [], []
    for p in pods:
        md = p.get("metadata") or {}
        if md.get("deletionTimestamp") or (md.get("labels") or {}).get(LABEL_STATE) != STATE_IDLE:
            continue
        if startup.ready(p):
            ready.append(p)
            continue
        err = startup.verdict(p, waited=dt.timedelta(0), unschedulable_grace=dt.timedelta.max)
        if err is None:
            starting.append(p)
        elif err.retryable:
            troubled.append(p)
    rng.shuffle(ready)

    def oldest_first(p: dict[str, Any]) -> str:
        return str(p["metadata"].get("creationTimestamp", ""))

    return ready + sorted(starting, key=oldest_first) + sorted(troubled, key=oldest_first)


async def claim(
    kube: KubeClient,
    namespace: str,
    pool: str,
    *,
    claimer: str,
    ttl: dt.timedelta,
    candidates: Sequence[dict[str, Any]] | None = None,
    ready_only: bool = False,
    rng: random.Random | None = None,
) -> ClaimResult:
    """Claim one idle pod of ``pool``; raise NoIdlePod if there is none to win.

    ``candidates`` (e.g. from an informer cache) saves the list call; a stale
    cache is safe, it only costs lost races.
    """
    rng = rng or random.Random()
    if candidates is None:
        candidates, _ = await list_all(kube, PODS, namespace, label_selector=pool_selector(pool))
    ranked = rank(candidates, rng)
    if ready_only:
        ranked = [p for p in ranked if startup.ready(p)]
    conflicts = 0
    for pod in ranked[:MAX_TRIES_PER_LIST]:
        now = dt.datetime.now(dt.UTC)
        try:
            won = await kube.patch(
                PODS,
                pod["metadata"]["name"],
                claim_patch(pod, claimer=claimer, now=now, ttl=ttl),
                namespace,
                content_type=JSON_PATCH,
            )
        except ApiError as e:
            # 422: a test op failed (someone else won); 404: the pod went away;
            # 409: the apiserver gave up retrying under heavy contention;
            # 403: policy refused the lease (the pod is too old for this ttl
            # under the max lifetime): a younger pod may still do.
            if e.status in (403, 404, 409, 422):
                conflicts += 1
                continue
            raise
        return ClaimResult(won, conflicts, startup.ready(won))
    raise NoIdlePod(
        f"pool {pool}: no idle pod to claim"
        + (f" ({conflicts} lost to other claimers)" if conflicts else "")
    )
