"""Lease decisions on both sides of every boundary (the clock is pinned)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sandman.contract import (
    ANN_EXPIRES_AT,
    ANN_IDLE_TIMEOUT,
    LABEL_CLAIM,
    LABEL_SANDBOX,
    LABEL_STATE,
    REASON_EXITED,
    REASON_IDLE,
    REASON_LEASE_EXPIRED,
    REASON_STUCK,
)
from sandman.reaper.decide import REASON_STUCK_REPORTED, StuckLimits, decide

T0 = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)
S = dt.timedelta(seconds=1)
LIMITS = StuckLimits(
    pending=dt.timedelta(minutes=10),
    failing=dt.timedelta(minutes=2),
    not_ready=dt.timedelta(minutes=15),
)
RS = {"kind": "ReplicaSet", "name": "rs", "controller": True, "uid": "u"}


def pod(
    *,
    phase: str = "Running",
    ready: bool = True,
    expires: str | None = "2026-11-30T13:00:00Z",
    ann: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
    waiting: str | None = None,
    labels: dict[str, str] | None = None,
    ready_since: str = "2026-11-30T12:00:05Z",
) -> dict[str, Any]:
    a = dict(ann or {})
    if expires:
        a[ANN_EXPIRES_AT] = expires
    md: dict[str, Any] = {
        "name": "p",
        "namespace": "n",
        "creationTimestamp": "2026-11-30T12:00:00Z",
        "labels": {LABEL_SANDBOX: "true", **(labels or {})},
        "annotations": a,
    }
    if owner:
        md["ownerReferences"] = [owner]
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "lastTransitionTime": ready_since,
            }
        ],
    }
    if waiting:
        status["containerStatuses"] = [{"name": "m", "state": {"waiting": {"reason": waiting}}}]
    return {"metadata": md, "status": status}


def test_lease_boundary() -> None:
    exp = dt.datetime(2026, 11, 30, 13, 0, tzinfo=dt.UTC)
    before = decide(pod(), exp - S, LIMITS)
    assert before.reason is None and before.next_check == exp
    at = decide(pod(), exp, LIMITS)
    assert at.reason == REASON_LEASE_EXPIRED and at.delete and at.deadline == exp


def test_idle_boundary_uses_the_trackers_instant() -> None:
    p = pod(ann={ANN_IDLE_TIMEOUT: "10m"})
    seen = T0 + dt.timedelta(minutes=5)  # last activity as the tracker knows it
    due = seen + dt.timedelta(minutes=10)
    assert decide(p, due - S, LIMITS, idle_since=seen).next_check == due
    d = decide(p, due, LIMITS, idle_since=seen)
    assert d.reason == REASON_IDLE and d.deadline == due
    # Unknown idleness (never Ready) decides nothing about idleness.
    assert (
        decide(pod(ann={ANN_IDLE_TIMEOUT: "10m"}, ready=False), due, LIMITS).reason != REASON_IDLE
    )


def test_exited_bare_vs_owned() -> None:
    assert decide(pod(phase="Succeeded"), T0, LIMITS).reason == REASON_EXITED
    assert decide(pod(phase="Failed", owner=RS), T0, LIMITS).reason is None


def test_stuck_pending_reclaims_bare_and_reports_owned() -> None:
    p = pod(phase="Pending", ready=False, ready_since="2026-11-30T12:00:00Z")
    limit = T0 + LIMITS.pending  # created 12:00 + 10 min
    assert decide(p, limit - S, LIMITS).reason is None
    d = decide(p, limit, LIMITS)
    assert (d.reason, d.delete) == (REASON_STUCK, True)
    owned = decide(
        pod(phase="Pending", ready=False, owner=RS, ready_since="2026-11-30T12:00:00Z"),
        limit,
        LIMITS,
    )
    assert (owned.reason, owned.delete) == (REASON_STUCK_REPORTED, False)


def test_image_pull_failure_counts_from_the_last_ready_transition() -> None:
    # Never Ready: the Ready condition says False since creation (12:00).
    p = pod(
        phase="Pending", ready=False, waiting="ImagePullBackOff", ready_since="2026-11-30T12:00:00Z"
    )
    assert decide(p, T0 + LIMITS.failing - S, LIMITS).reason is None
    assert decide(p, T0 + LIMITS.failing, LIMITS).reason == REASON_STUCK
    # Ready until 14:00, crashing since: the limit counts from 14:00, not creation.
    late = pod(
        ready=False,
        waiting="CrashLoopBackOff",
        ready_since="2026-11-30T14:00:00Z",
        expires="2026-12-01T00:00:00Z",
    )
    t14 = dt.datetime(2026, 11, 30, 14, 0, tzinfo=dt.UTC)
    assert decide(late, t14 + LIMITS.failing - S, LIMITS).reason is None
    assert decide(late, t14 + LIMITS.failing, LIMITS).reason == REASON_STUCK


def test_idle_pool_pods_are_exempt_from_lease_and_idleness() -> None:
    p = pod(
        owner=RS,
        labels={LABEL_STATE: "idle"},
        ann={ANN_IDLE_TIMEOUT: "1m"},
        expires="2026-11-30T12:01:00Z",
    )
    far = T0 + dt.timedelta(days=1)
    assert decide(p, far, LIMITS, idle_since=T0).reason is None
    # A claimed pool pod (state changed, released by the ReplicaSet) is a sandbox like any.
    claimed = pod(labels={LABEL_STATE: "claimed"}, expires="2026-11-30T12:01:00Z")
    assert decide(claimed, far, LIMITS).reason == REASON_LEASE_EXPIRED
    # A held pool pod (two-phase claim: still idle and owned, claim=held) got a
    # lease at the hold; it is not exempt, or holding and never leaving would
    # keep it past that lease.
    held = pod(
        owner=RS,
        labels={LABEL_STATE: "idle", LABEL_CLAIM: "held"},
        expires="2026-11-30T12:01:00Z",
    )
    assert decide(held, far, LIMITS).reason == REASON_LEASE_EXPIRED


def test_terminating_pods_are_left_alone() -> None:
    p = pod(expires="2026-11-30T12:01:00Z")
    p["metadata"]["deletionTimestamp"] = "2026-11-30T12:02:00Z"
    assert decide(p, T0 + dt.timedelta(hours=1), LIMITS).reason is None


def test_garbage_annotations_do_not_reclaim() -> None:
    p = pod(expires="not-a-time", ann={ANN_IDLE_TIMEOUT: "soon"})
    d = decide(p, T0 + dt.timedelta(days=3), LIMITS, idle_since=T0)
    assert d.reason is None and d.next_check is None


def test_out_of_range_annotations_never_make_the_reaper_raise() -> None:
    # "99999999999d" raised OverflowError from decide(): the reaper retried that
    # pod forever. Out-of-range values now read as absent (the webhook refuses
    # them at admission; the lease and the kubelet's deadline still apply).
    for ann in (
        {ANN_IDLE_TIMEOUT: "99999999999d"},
        {ANN_IDLE_TIMEOUT: "1" + "0" * 400 + "s"},
        {ANN_EXPIRES_AT: "0001-01-01T00:00:00+14:00"},
        {ANN_EXPIRES_AT: "9999-12-31T23:59:59-14:00"},
    ):
        p = pod(ann=ann, expires=None)
        d = decide(p, T0 + 10 * 365 * 24 * 3600 * S, LIMITS, idle_since=T0)
        assert d.reason is None, ann


def test_a_bare_pod_that_ends_with_its_command_is_kept_until_its_lease_ends() -> None:
    # Its user reads the exit code and logs, as without Sandman; a sandbox that
    # merely exited is reclaimed at once.
    done = pod(phase="Succeeded", ann={"sandman.dev/exit-with-command": "true"})
    lease_end = dt.datetime(2026, 11, 30, 13, 0, tzinfo=dt.UTC)
    kept = decide(done, lease_end - S, LIMITS)
    assert kept.reason is None and kept.next_check == lease_end
    gone = decide(done, lease_end, LIMITS)
    assert gone.reason == REASON_EXITED and gone.delete and gone.deadline == lease_end
    by_flag = pod(phase="Failed")
    by_flag["spec"] = {
        "containers": [{"command": ["sandmand", "serve", "--exit-with-command", "--", "x"]}]
    }
    assert decide(by_flag, lease_end - S, LIMITS).reason is None
    after_sep = pod(phase="Failed")  # the flag after "--" is the command's, not the daemon's
    after_sep["spec"] = {
        "containers": [{"command": ["sandmand", "serve", "--", "--exit-with-command"]}]
    }
    assert decide(after_sep, lease_end - S, LIMITS).reason == REASON_EXITED
    assert decide(pod(phase="Succeeded"), lease_end - S, LIMITS).reason == REASON_EXITED
