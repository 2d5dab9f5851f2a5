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
from typing import Any, Literal

import aiohttp

from sandman.client import reuse, startup
from sandman.clock import utc_now
from sandman.contract import ANN_EXPIRES_AT, LABEL_CLAIM, LABEL_STATE, format_time
from sandman.kube_async import JSON_PATCH, PODS, ApiError, KubeClient, escape_pointer, list_all
from sandman.pools.spec import (
    ANN_CLAIMED_AT,
    ANN_CLAIMED_BY,
    CLAIM_HELD,
    DELETION_COST,
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


def hold_patch(
    pod: dict[str, Any], *, claimer: str, now: dt.datetime, ttl: dt.timedelta
) -> list[dict[str, Any]]:
    """The claim itself: the pod is ours, but still in its pool (a two-phase
    claim leaves the pool only after the pool was scaled down)."""
    md = pod["metadata"]
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/uid", "value": md["uid"]},
        {"op": "test", "path": _label(LABEL_STATE), "value": STATE_IDLE},
        # null tests for absence (the apiserver's json-patch): never claim a
        # pod the ReplicaSet is already deleting (e.g. after a scale-down), or
        # one that another claimer holds.
        {"op": "test", "path": "/metadata/deletionTimestamp", "value": None},
        {"op": "test", "path": _label(LABEL_CLAIM), "value": None},
        {"op": "add", "path": _label(LABEL_CLAIM), "value": CLAIM_HELD},
    ]
    if not md.get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    ops += [
        {"op": "add", "path": _ann(ANN_CLAIMED_BY), "value": claimer},
        {"op": "add", "path": _ann(ANN_CLAIMED_AT), "value": format_time(now)},
        {"op": "add", "path": _ann(ANN_EXPIRES_AT), "value": format_time(now + ttl)},
    ]
    return ops


def leave_patch(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """Out of the pool: out of the selector (the ReplicaSet refills unless it
    was scaled down first) and no longer owned (deleting the pool cannot take
    it along)."""
    md = pod["metadata"]
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/uid", "value": md["uid"]},
        {"op": "replace", "path": _label(LABEL_STATE), "value": STATE_CLAIMED},
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


def claim_patch(
    pod: dict[str, Any], *, claimer: str, now: dt.datetime, ttl: dt.timedelta
) -> list[dict[str, Any]]:
    """Hold and leave in one write (the usual claim)."""
    leave = leave_patch(pod)[1:]  # the uid test is in the hold part already
    return hold_patch(pod, claimer=claimer, now=now, ttl=ttl) + leave


def cheapest_to_delete_patch() -> list[dict[str, Any]]:
    """Make a held pod the ReplicaSet's first choice on a scale-down (among
    Ready pods), so the scale-down picks it, is denied by the webhook (the pod
    is held) and deletes nothing, instead of deleting a warm pod."""
    return [{"op": "add", "path": _ann(DELETION_COST), "value": str(-(2**31) + 1)}]


def rank(pods: Sequence[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """Claim order: Ready pods first (shuffled, so many claimers spread out
    instead of all racing for the first one), then pods still starting, oldest
    first (closest to Ready), then pods in trouble that may yet start (e.g. a
    pull in back-off). Pods that are terminating or can never start are left
    alone, and so are pods whose container restarted: their daemon's pristine
    record proves nothing (``sandman.client.reuse``); the pool replaces them."""
    ready, starting, troubled = [], [], []
    for p in pods:
        md = p.get("metadata") or {}
        labels = md.get("labels") or {}
        if md.get("deletionTimestamp") or labels.get(LABEL_STATE) != STATE_IDLE:
            continue
        if labels.get(LABEL_CLAIM):  # held by a claimer, on its way out
            continue
        if reuse.restarts(p):
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


PatchOutcome = Literal["lost", "unknown", "fatal"]


def patch_outcome(error: BaseException) -> PatchOutcome:
    """What a failed claim patch says about the race.

    - ``lost``: the pod is not ours and cannot be: another claimer won (422,
      a test op failed), it went away (404), the apiserver gave up under
      contention (409), or policy refused the lease (403: the pod is too old
      for this ttl under the max lifetime; a younger one may do);
    - ``unknown``: the answer says nothing about whether the patch applied
      (a 5xx, a webhook that timed out, 429 past the client's own waits, a
      client-side timeout or a dropped connection), so the pod is read back;
    - ``fatal``: anything else (a malformed patch, no permission): raised.
    """
    if isinstance(error, ApiError):
        if error.status in (403, 404, 409, 422):
            return "lost"
        if error.status == 429 or error.status >= 500:
            return "unknown"
        return "fatal"
    if isinstance(error, (TimeoutError, aiohttp.ClientError)):
        return "unknown"
    return "fatal"


def stamped_by(pod: dict[str, Any], claimer: str, now: dt.datetime) -> bool:
    """Whether ``pod`` carries this claim's own stamp (who and when): a patch
    whose answer was lost did apply."""
    ann = pod.get("metadata", {}).get("annotations") or {}
    return ann.get(ANN_CLAIMED_BY) == claimer and ann.get(ANN_CLAIMED_AT) == format_time(now)


async def _read_back(
    kube: KubeClient, namespace: str, pod: dict[str, Any], claimer: str, now: dt.datetime
) -> dict[str, Any] | None:
    """The pod if our unanswered patch won it, else None (a read that fails
    too counts as a loss: the lease ends an orphaned hold)."""
    try:
        cur = await kube.get(PODS, pod["metadata"]["name"], namespace)
    except (ApiError, TimeoutError, aiohttp.ClientError):
        return None
    if cur["metadata"].get("uid") != pod["metadata"]["uid"]:
        return None
    return cur if stamped_by(cur, claimer, now) else None


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
    leave: bool = True,
    reserved: set[str] | None = None,
) -> ClaimResult:
    """Claim one idle pod of ``pool``; raise NoIdlePod if there is none to win.

    ``candidates`` (e.g. from an informer cache) saves the list call; a stale
    cache is safe, it only costs lost races. With ``leave=False`` the pod is
    held but stays in its pool until ``leave_pool`` (a two-phase claim).

    ``reserved``: the UIDs the other claimers of this process are trying (or
    won), shared by them. Claims skip those, so many claims at once from one
    process never race each other: racing costs a lost round trip per
    collision, and N claims on N candidates collide often (the birthday
    problem), which made a burst of claims from one client slower than the
    pool. A UID stays reserved when its claim wins (its owner drops it once
    its cache shows the pod claimed or gone) and is released when it loses.
    """
    rng = rng or random.Random()
    conflicts = 0
    # A cached list whose every try lost may just be stale (pods claimed a
    # moment ago still look idle in it): one fresh list before giving up.
    passes = (False, True) if candidates is not None else (True,)
    for fresh in passes:
        if fresh:
            candidates, _ = await list_all(
                kube, PODS, namespace, label_selector=pool_selector(pool)
            )
        assert candidates is not None
        ranked = rank(candidates, rng)
        if ready_only:
            ranked = [p for p in ranked if startup.ready(p)]
        lost_before = conflicts
        tries = 0
        for pod in ranked:
            uid = pod["metadata"]["uid"]
            if reserved is not None:
                if uid in reserved:
                    continue  # another claimer of ours is on it
                reserved.add(uid)
            if tries == MAX_TRIES_PER_LIST:
                if reserved is not None:
                    reserved.discard(uid)
                break
            tries += 1
            now = utc_now()
            try:
                won = await kube.patch(
                    PODS,
                    pod["metadata"]["name"],
                    claim_patch(pod, claimer=claimer, now=now, ttl=ttl)
                    if leave
                    else hold_patch(pod, claimer=claimer, now=now, ttl=ttl)
                    + cheapest_to_delete_patch(),
                    namespace,
                    content_type=JSON_PATCH,
                )
            except (ApiError, TimeoutError, aiohttp.ClientError) as e:
                outcome = patch_outcome(e)
                if outcome == "fatal":
                    if reserved is not None:
                        reserved.discard(uid)
                    raise
                # Under a burst the apiserver or the webhook may fail or time
                # out: such a claim used to be lost; the pod is read back.
                got = None
                if outcome == "unknown":
                    got = await _read_back(kube, namespace, pod, claimer, now)
                if got is None:
                    if reserved is not None:
                        reserved.discard(uid)
                    conflicts += 1
                    continue
                won = got
            if reuse.restarts(won):
                # It restarted after the candidates were listed: ours now, so ours
                # to replace (deleted; the ReplicaSet refills), never to hand out.
                await _discard(kube, namespace, won)
                continue
            return ClaimResult(won, conflicts, startup.ready(won))
        if conflicts == lost_before:
            break  # nothing in it was stale: a fresh list would say the same
    raise NoIdlePod(
        f"pool {pool}: no idle pod to claim"
        + (f" ({conflicts} lost to other claimers)" if conflicts else "")
    )


async def _discard(kube: KubeClient, namespace: str, pod: dict[str, Any]) -> None:
    md = pod["metadata"]
    try:
        await kube.delete(PODS, md["name"], namespace, uid=md["uid"])
    except ApiError as e:
        if not (e.not_found or e.conflict):
            raise


async def leave_pool(kube: KubeClient, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    """Second phase of a two-phase claim."""
    return await kube.patch(  # type: ignore[no-any-return]
        PODS, pod["metadata"]["name"], leave_patch(pod), namespace, content_type=JSON_PATCH
    )
