"""When is a sandbox's lease over, and why? (pure: a pod and ``now`` in, a decision out)

A sandbox's lease ends at the first of (design section 6): ``expires-at``
passed (LeaseExpired); no daemon API call for ``idle-timeout``
(IdleReclaimed); stuck: unschedulable, image pull failing, crash-looping or
never Ready beyond a limit (StuckReclaimed); its container finished (Exited).

Who owns the pod changes what reclaiming means (the owner's semantics win,
we never fight a controller):

- bare pod: deleted for every reason; one that ends with its command
  (``--exit-with-command``) is kept once finished until its lease ends, so
  its user can read the exit code and logs, as without Sandman.
- idle warm-pool pod (controller-owned, state label ``idle``): exempt
  from lease and idleness (waiting is its job; its lease starts at claim);
  stuck is reported, not deleted.
- other controller-owned pod (ReplicaSet, Job, ...): deleted at lease end or
  idleness (the owner decides about a replacement); stuck is reported only (a
  replacement would fail the same way: deleting it would be churn); finished
  pods are left to the owner (a Job keeps them for its status).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sandman.contract import (
    ANN_EXIT_WITH_COMMAND,
    ANN_EXPIRES_AT,
    ANN_IDLE_TIMEOUT,
    LABEL_CLAIM,
    LABEL_STATE,
    REASON_EXITED,
    REASON_IDLE,
    REASON_LEASE_EXPIRED,
    REASON_STUCK,
    REASON_STUCK_REPORTED,
    STATE_IDLE,
    ContractError,
    annotations,
    controller_of,
    labels,
    parse_duration,
    parse_time,
)

# The daemon flag of pods that end with their command (webhook/mutate.py).
EXIT_FLAG = "--exit-with-command"

# Waiting reasons of a container that will not get better by waiting.
PULL_FAILURES = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RegistryUnavailable",
    }
)
CRASHING = frozenset(
    {"CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)


@dataclass(frozen=True)
class StuckLimits:
    """How long a sandbox may fail to come up before it counts as stuck.

    Defaults: 10 min Pending leaves room for a cold multi-GB pull on a busy
    node (80 s measured on GKE for 1.2 GB; several in parallel take longer);
    a pull error or crash loop is reported within 2 min, long enough for the
    kubelet's first retries (10 s, 20 s, 40 s backoff) to succeed if the cause
    was transient; 15 min to become Ready covers a slow daemon start behind a
    long init container.
    """

    pending: dt.timedelta = dt.timedelta(minutes=10)
    failing: dt.timedelta = dt.timedelta(minutes=2)
    not_ready: dt.timedelta = dt.timedelta(minutes=15)


@dataclass(frozen=True)
class Decision:
    """``reason`` is set when the sandbox is due now; ``next_check`` is when to
    look again otherwise (None: nothing time-based is pending)."""

    reason: str | None = None
    message: str = ""
    delete: bool = False  # False: report (Event) only
    next_check: dt.datetime | None = None
    deadline: dt.datetime | None = None  # when it became due (for latency metrics)


def is_idle_pool_pod(pod: dict[str, Any]) -> bool:
    """A warm pod waiting in its pool. A held pod (``claim`` label, a two-phase
    claim on its way out) is not: the hold gave it a lease of its own, and
    exempting it would let a user hold a pod and never leave to keep it forever."""
    lbl = labels(pod)
    return (
        lbl.get(LABEL_STATE) == STATE_IDLE
        and not lbl.get(LABEL_CLAIM)
        and controller_of(pod) is not None
    )


def _time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        return parse_time(value)
    except ContractError:
        return None


def _condition_since(pod: dict[str, Any], type_: str) -> dt.datetime | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return _time(c.get("lastTransitionTime"))
    return None


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _waiting(pod: dict[str, Any]) -> list[str]:
    st = pod.get("status") or {}
    out = []
    for cs in [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            out.append(waiting["reason"])
    return out


def ends_with_command(pod: dict[str, Any]) -> bool:
    """The pod was meant to finish: the daemon exits with its command."""
    if annotations(pod).get(ANN_EXIT_WITH_COMMAND) == "true":
        return True
    for c in (pod.get("spec") or {}).get("containers") or []:
        cmd = c.get("command") or []
        flags = cmd[: cmd.index("--")] if "--" in cmd else cmd
        if EXIT_FLAG in flags:
            return True
    return False


def idle_timeout(pod: dict[str, Any]) -> dt.timedelta | None:
    value = annotations(pod).get(ANN_IDLE_TIMEOUT)
    if not value:
        return None
    try:
        return parse_duration(value)
    except ContractError:
        return None


def decide(
    pod: dict[str, Any],
    now: dt.datetime,
    limits: StuckLimits,
    *,
    idle_since: dt.datetime | None = None,
) -> Decision:
    """``idle_since``: when the daemon was last active (or unreachable since),
    as the idle tracker knows it; None when unknown."""
    md = pod.get("metadata") or {}
    if md.get("deletionTimestamp"):
        return Decision()  # already going
    owner = controller_of(pod)
    pool_idle = is_idle_pool_pod(pod)
    phase = (pod.get("status") or {}).get("phase", "Pending")
    checks: list[dt.datetime] = []

    # -- exited -------------------------------------------------------------
    if phase in ("Succeeded", "Failed"):
        if owner is not None:
            return Decision()
        kept_until = _time(annotations(pod).get(ANN_EXPIRES_AT)) if ends_with_command(pod) else None
        if kept_until is not None and now < kept_until:
            # It ran to completion on purpose: its user reads the exit code and
            # logs as they would without Sandman, until the lease ends.
            return Decision(next_check=kept_until)
        return Decision(
            REASON_EXITED,
            f"sandbox finished ({phase})",
            delete=True,
            deadline=kept_until or now,
        )

    # -- lease --------------------------------------------------------------
    if not pool_idle:
        expires = _time(annotations(pod).get(ANN_EXPIRES_AT))
        if expires is not None:
            if now >= expires:
                ended = annotations(pod)[ANN_EXPIRES_AT]
                return Decision(
                    REASON_LEASE_EXPIRED, f"lease ended at {ended}", delete=True, deadline=expires
                )
            checks.append(expires)

    # -- stuck --------------------------------------------------------------
    created = _time(md.get("creationTimestamp")) or now
    stuck = _stuck(pod, phase, created, now, limits, checks)
    if stuck is not None:
        _reason, message, since = stuck
        if owner is None:
            return Decision(REASON_STUCK, message, delete=True, deadline=since)
        return Decision(
            REASON_STUCK_REPORTED,
            message + f"; left to its {owner.get('kind')}",
            delete=False,
            deadline=since,
        )

    # -- idle ---------------------------------------------------------------
    timeout = idle_timeout(pod)
    if timeout is not None and not pool_idle and idle_since is not None and _ready(pod):
        due = idle_since + timeout
        if now >= due:
            return Decision(
                REASON_IDLE, f"no daemon API call for {timeout}", delete=True, deadline=due
            )
        checks.append(due)
    return Decision(next_check=min(checks) if checks else None)


def _stuck(
    pod: dict[str, Any],
    phase: str,
    created: dt.datetime,
    now: dt.datetime,
    limits: StuckLimits,
    checks: list[dt.datetime],
) -> tuple[str, str, dt.datetime] | None:
    waiting = _waiting(pod)
    failing = [w for w in waiting if w in PULL_FAILURES or w in CRASHING]
    # A waiting reason carries no "since". The last Ready transition (or the
    # pod's creation) is the conservative clock: a sandbox that was fine for
    # hours and just started to crash gets the full limit, not zero.
    since = max(created, _condition_since(pod, "Ready") or created)
    if failing:
        due = since + limits.failing
        if now >= due:
            return REASON_STUCK, f"container {failing[0]} for over {limits.failing}", due
        checks.append(due)
        return None
    if phase == "Pending":
        due = created + limits.pending
        if now >= due:
            scheduled = _condition_since(pod, "PodScheduled")
            where = (
                "unschedulable"
                if scheduled is None
                or not any(
                    c.get("type") == "PodScheduled" and c.get("status") == "True"
                    for c in (pod.get("status") or {}).get("conditions") or []
                )
                else "not started"
            )
            return REASON_STUCK, f"Pending ({where}) for over {limits.pending}", due
        checks.append(due)
        return None
    if phase == "Running" and not _ready(pod):
        due = since + limits.not_ready
        if now >= due:
            return REASON_STUCK, f"never Ready within {limits.not_ready}", due
        checks.append(due)
    return None
