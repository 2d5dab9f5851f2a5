"""What an UPDATE may change on a sandbox (pure: old pod, new pod, rule set in).

Every way into a live pod goes through here: metadata edits, ``kubectl set
image``, ``kubectl debug`` (the ``pods/ephemeralcontainers`` subresource) and
in-place resize (``pods/resize``). Two kinds of rules:

- the contract (``HARD_RULES``), denied in every mode: a pod becomes a sandbox
  only at CREATE (through injection) and stays one; its identity, its
  profile and the markers the webhook wrote never change; its lease never
  disappears, nor becomes unreadable (the reaper could not tell when it ends),
  nor ends past creation + the policy's max TTL; it never becomes an idle
  pool pod (exempt from its lease); and the integrity rules of
  ``webhook/integrity.py`` hold for what it adds (a debug container drops the
  capabilities the rule set does not grant, nothing is mounted over the
  daemon's tree, no toleration reaches another profile's dedicated nodes).
  The same set is denied in every mode at CREATE (``review._apply_mode``).
- the policy: an update may not add a breach the pod did not already have.
  The whole pod is checked again (``checks.check``) and compared with the
  old one, so a pod admitted under an older, laxer policy can still be
  labeled or have its lease moved, while a new image from a registry the
  policy does not allow, a privileged debug container or a resize above
  the maximum is refused. These follow the rule set's mode.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from sandman.contract import (
    ANN_ADMITTED,
    ANN_EXPIRES_AT,
    ANN_IDLE_TIMEOUT,
    ANN_INJECTED,
    ANN_KEY_ID,
    ANN_PROFILE,
    ANN_TOKEN_SHA256,
    LABEL_ID,
    LABEL_SANDBOX,
    LABEL_STATE,
    STATE_IDLE,
    ContractError,
    annotations,
    controller_of,
    format_duration,
    format_time,
    is_sandbox,
    labels,
    parse_time,
)
from sandman.webhook.checks import check
from sandman.webhook.policy import RuleSet, Violation

HARD_RULES = frozenset(
    {
        "sandbox-label",
        "sandbox-id",
        "sandbox-marker",
        "profile-immutable",
        "lease-removed",
        "lease-format",
        "daemon-volume",
        # The lease's bound: the kubelet's activeDeadlineSeconds is the same
        # max TTL, so a later expires-at only misleads the reaper and users.
        "lease-max",
        "ttl-max",
        # webhook/integrity.py
        "capability-drop",
        "daemon-dir",
        "dedicated-nodes",
        "pool-state",
    }
)
# Written by the webhook at CREATE; what the reaper and the token derive from.
IMMUTABLE_ANNOTATIONS = (ANN_INJECTED, ANN_ADMITTED, ANN_KEY_ID, ANN_TOKEN_SHA256)


def _sandbox_label(old: dict[str, Any], new: dict[str, Any]) -> Iterator[Violation]:
    if not is_sandbox(old):
        yield Violation(
            "sandbox-label",
            f"label {LABEL_SANDBOX} cannot be added to a running pod (it would be "
            "reclaimed and polled as a sandbox it never became)",
            "create a new pod with the label instead",
        )
    elif not is_sandbox(new):
        yield Violation(
            "sandbox-label",
            f"label {LABEL_SANDBOX} cannot be removed from a sandbox (it would escape its lease)",
            "delete the pod instead",
        )


def _identity(old: dict[str, Any], new: dict[str, Any]) -> Iterator[Violation]:
    if labels(old).get(LABEL_ID) != labels(new).get(LABEL_ID):
        yield Violation(
            "sandbox-id",
            f"label {LABEL_ID} is immutable (the access token derives from it)",
            "leave the label as the webhook set it",
        )
    a_old, a_new = annotations(old), annotations(new)
    for key in IMMUTABLE_ANNOTATIONS:
        if a_old.get(key) != a_new.get(key):
            yield Violation(
                "sandbox-marker",
                f"annotation {key} is immutable (the webhook wrote it at admission)",
                "leave the annotation as the webhook set it",
            )
    if a_old.get(ANN_PROFILE) != a_new.get(ANN_PROFILE):
        # What the profile asked for was applied at admission (--no-reset,
        # Guaranteed QoS, nodes); a pod relabelled later would claim a profile
        # it does not have (an eval sandbox relabelled rollout becomes claimable).
        yield Violation(
            "profile-immutable",
            f"annotation {ANN_PROFILE} cannot change on a sandbox (the profile was applied "
            "at admission)",
            "create a new sandbox with the profile you need",
        )


def _lease(
    old: dict[str, Any], new: dict[str, Any], rule: RuleSet, now: dt.datetime
) -> Iterator[Violation]:
    a_old, a_new = annotations(old), annotations(new)
    if ANN_EXPIRES_AT in a_old and ANN_EXPIRES_AT not in a_new:
        yield Violation(
            "lease-removed",
            f"annotation {ANN_EXPIRES_AT} cannot be removed (the lease would never end)",
            f"move {ANN_EXPIRES_AT} instead (within the policy's max TTL)",
        )
        return
    value = a_new.get(ANN_EXPIRES_AT)
    if value is None or value == a_old.get(ANN_EXPIRES_AT):
        return
    created = (old.get("metadata") or {}).get("creationTimestamp")
    try:
        exp = parse_time(value, field=ANN_EXPIRES_AT)
        start = parse_time(created, field="creationTimestamp") if created else now
    except ContractError as e:
        yield Violation("lease-format", str(e), "use RFC 3339, e.g. 2026-11-30T12:00:00Z")
        return
    if exp > start + rule.max_ttl:
        yield Violation(
            "lease-max",
            f"{ANN_EXPIRES_AT}={value} is past the maximum lifetime "
            f"({format_time(start + rule.max_ttl)})",
            "extend the lease to at most creation time + the policy's max TTL",
        )


def _pool_state(old: dict[str, Any], new: dict[str, Any]) -> Iterator[Violation]:
    """Idle pool pods (state ``idle`` and a controller) are exempt from lease
    and idleness (reaper/decide.py). A pool's pods are created so by its
    ReplicaSet, and an UPDATE only ever takes them out (a claim: ``claimed``,
    owner removed); so no UPDATE may make a pod one: neither the label nor,
    on a pod already labelled idle, a new controller (an orphan stays one and
    keeps the lease it got at creation)."""
    if labels(new).get(LABEL_STATE) != STATE_IDLE:
        return
    fix = (
        f"leave label {LABEL_STATE} as it is; to keep a sandbox longer, move "
        f"{ANN_EXPIRES_AT} (up to creation + the policy's max TTL); for warm sandboxes, "
        "create a pool (sandman pool create)"
    )
    if labels(old).get(LABEL_STATE) != STATE_IDLE:
        yield Violation(
            "pool-state",
            f"label {LABEL_STATE}={STATE_IDLE} cannot be set on a running sandbox: it marks an "
            "unclaimed warm-pool pod, exempt from its lease and idle timeout, and only a "
            "pool's ReplicaSet creates pods with it",
            fix,
        )
        return
    ref = controller_of(new)
    if ref is not None and ref != controller_of(old):
        yield Violation(
            "pool-state",
            f"a pod labelled {LABEL_STATE}={STATE_IDLE} cannot get a new controller "
            f"({ref.get('kind')} {ref.get('name')}): it would become an idle pool pod, exempt "
            "from its lease",
            fix,
        )


def _idle_removed(old: dict[str, Any], new: dict[str, Any], rule: RuleSet) -> Iterator[Violation]:
    cap = rule.max_idle_timeout
    removed = ANN_IDLE_TIMEOUT in annotations(old) and ANN_IDLE_TIMEOUT not in annotations(new)
    if cap is not None and removed:
        yield Violation(
            "idle-timeout-max",
            f"removing {ANN_IDLE_TIMEOUT} would leave no idle timeout; the maximum is "
            f"{format_duration(cap)}",
            f"set {ANN_IDLE_TIMEOUT} to {format_duration(cap)} or less",
        )


def _new_breaches(
    old: dict[str, Any], new: dict[str, Any], rule: RuleSet, trusted: dict[str, frozenset[str]]
) -> Iterator[Violation]:
    before = {v.text() for v in check(old, rule, **trusted)}
    for v in check(new, rule, **trusted):
        if v.text() not in before:
            yield v


def update_violations(
    old: dict[str, Any],
    new: dict[str, Any],
    rule: RuleSet,
    *,
    trusted_images: frozenset[str],
    trusted_host_paths: frozenset[str] = frozenset(),
    now: dt.datetime,
) -> list[Violation]:
    """Every way this update breaks the contract or adds a policy breach."""
    label = list(_sandbox_label(old, new))
    if label:
        return label  # not (or no longer) a sandbox: nothing else applies
    return [
        *_identity(old, new),
        *_pool_state(old, new),
        *_lease(old, new, rule, now),
        *_idle_removed(old, new, rule),
        *_new_breaches(
            old,
            new,
            rule,
            {"trusted_images": trusted_images, "trusted_host_paths": trusted_host_paths},
        ),
    ]
