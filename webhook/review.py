"""AdmissionReview in, AdmissionReview out: the webhook's decisions (no I/O).

Two error channels, as the API server expects (kopf's webhooks do the same):
a review that cannot be understood is the caller's bug and gets an HTTP 4xx
(:class:`WebhookError`); a pod that breaks the policy or the contract gets a
200 with ``allowed: false`` and a message that names the rule and the fix.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sandman.contract import (
    CLAIM_HELD,
    LABEL_CLAIM,
    LABEL_STATE,
    NAMESPACE,
    STATE_CLAIMED,
    is_sandbox,
    labels,
)
from sandman.webhook.checks import check
from sandman.webhook.mutate import InjectionSettings, MutationError, mutate, node_release_path
from sandman.webhook.policy import Policy, RuleSet, Violation, denial_text, profile_of
from sandman.webhook.rewrite import ImageFacts
from sandman.webhook.updates import HARD_RULES, update_violations

log = logging.getLogger("sandman.webhook")

PROTECTED_NAMESPACES = frozenset({"kube-system", NAMESPACE})
# The controllers that delete pool pods on their own (kube-controller-manager
# with --use-service-account-credentials, as the local cluster runs it).
POOL_CONTROLLERS = frozenset(
    {
        "system:serviceaccount:kube-system:replicaset-controller",
        "system:serviceaccount:kube-system:generic-garbage-collector",
    }
)


class WebhookError(Exception):
    """A malformed request: answered with an HTTP error, not a review."""

    status = 400


class MalformedReview(WebhookError):
    status = 400


class UnknownEndpoint(WebhookError):
    status = 404


@dataclass(frozen=True)
class Review:
    uid: str
    operation: str
    namespace: str
    obj: dict[str, Any]
    old: dict[str, Any] | None
    dry_run: bool
    kind: str
    username: str = ""
    subresource: str = ""  # "ephemeralcontainers" (kubectl debug), "resize", ...


def parse_review(body: Any) -> Review:
    if not isinstance(body, dict) or body.get("kind") != "AdmissionReview":
        raise MalformedReview("expected an AdmissionReview")
    if body.get("apiVersion") != "admission.k8s.io/v1":
        raise MalformedReview("only admission.k8s.io/v1 reviews are supported")
    req = body.get("request")
    if not isinstance(req, dict) or not isinstance(req.get("uid"), str):
        raise MalformedReview("the review has no request.uid")
    kind = (req.get("kind") or {}).get("kind", "")
    obj = req.get("object")
    if req.get("operation") != "DELETE" and not isinstance(obj, dict):
        raise MalformedReview("the review has no request.object")
    return Review(
        uid=req["uid"],
        operation=req.get("operation", ""),
        namespace=req.get("namespace") or "",
        obj=obj or {},
        old=req.get("oldObject"),
        dry_run=bool(req.get("dryRun")),
        kind=kind,
        username=(req.get("userInfo") or {}).get("username", ""),
        subresource=req.get("subResource") or "",
    )


@dataclass
class Outcome:
    """A decision plus what the server should count and log about it."""

    allowed: bool
    patch: list[dict[str, Any]] | None = None
    warnings: list[str] = field(default_factory=list)
    message: str = ""
    result: str = "allowed"  # allowed | injected | denied | warned | audited | skipped
    rule_ids: list[str] = field(default_factory=list)
    mode: str = ""
    sandbox_id: str | None = None

    def response(self, uid: str) -> dict[str, Any]:
        resp: dict[str, Any] = {"uid": uid, "allowed": self.allowed}
        if self.patch:
            resp["patchType"] = "JSONPatch"
            resp["patch"] = base64.b64encode(json.dumps(self.patch).encode()).decode()
        if self.warnings:
            # The apiserver caps warnings; keep each short and their number small.
            resp["warnings"] = [w[:256] for w in self.warnings[:10]]
        if not self.allowed:
            resp["status"] = {"code": 403, "reason": "Forbidden", "message": self.message}
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}


@dataclass(frozen=True)
class Context:
    """Everything a decision depends on, injected (tests pin each of them)."""

    policy: Callable[[], Policy]
    namespace_labels: Callable[[str], dict[str, str]]
    settings: InjectionSettings
    now: Callable[[], dt.datetime]
    new_id: Callable[[], str]
    token_hash_for: Callable[[str, str], str]  # (namespace, sandbox id) -> sha256 hex
    # (namespace, sandbox id) -> the annotations only the webhook can write
    # (admission marker, key generation; webhook/access.py marks_for)
    marks: Callable[[str, str], dict[str, str]] | None = None
    # What the server read from registries before deciding (None: lookups off).
    images: Mapping[str, ImageFacts] | None = None

    def rule_for(self, namespace: str) -> RuleSet:
        return self.policy().select(self.namespace_labels(namespace))


def _name(r: Review) -> str:
    md = r.obj.get("metadata") or {}
    return f"{r.namespace}/{md.get('name') or md.get('generateName', '') + '*'}"


def decide_mutation(ctx: Context, r: Review) -> Outcome:
    if r.kind != "Pod" or r.operation != "CREATE":
        return Outcome(True, result="skipped")
    if r.namespace in PROTECTED_NAMESPACES or not is_sandbox(r.obj):
        return Outcome(True, result="skipped")
    rule = ctx.rule_for(r.namespace)
    try:
        m = mutate(
            r.obj,
            rule=rule,
            settings=ctx.settings,
            now=ctx.now(),
            new_id=ctx.new_id,
            token_hash_for=lambda sid: ctx.token_hash_for(r.namespace, sid),
            marks=(lambda sid: ctx.marks(r.namespace, sid)) if ctx.marks else None,
            images=ctx.images,
            namespace_labels=ctx.namespace_labels(r.namespace),
        )
    except MutationError as e:
        message = f"sandman: [contract] {e}" if e.rule == "contract" else str(e)
        return Outcome(False, message=message, result="denied", rule_ids=[e.rule], mode=rule.mode)
    return Outcome(
        True,
        patch=m.patch,
        warnings=m.warnings,
        result="injected" if m.patch else "allowed",
        sandbox_id=m.sandbox_id,
    )


def _denial(violations: list[Violation], rule: RuleSet) -> str:
    return denial_text(violations, rule)


def decide_validation(ctx: Context, r: Review) -> Outcome:
    if r.kind != "Pod" or r.namespace in PROTECTED_NAMESPACES:
        return Outcome(True, result="skipped")
    if r.operation == "DELETE":
        return _validate_delete(r)
    rule = ctx.rule_for(r.namespace)
    if r.operation == "UPDATE" and r.old is not None:
        return _validate_update(ctx, r, rule)
    if r.operation != "CREATE" or not is_sandbox(r.obj):
        return Outcome(True, result="skipped")
    violations = check(r.obj, rule, **_trusted(ctx))
    return _apply_mode(violations, rule)


def _trusted(ctx: Context) -> dict[str, frozenset[str]]:
    """What the webhook injects itself: exempt from the checks that would refuse it."""
    shared = ctx.settings.daemon_shared_dir
    return {
        "trusted_images": frozenset({ctx.settings.daemon_image}),
        "trusted_host_paths": frozenset(
            {shared, node_release_path(ctx.settings)} if shared else ()
        ),
    }


def _apply_mode(violations: list[Violation], rule: RuleSet) -> Outcome:
    """The rule set's mode decides, except for ``HARD_RULES``: those guard
    other sandboxes and Sandman itself (webhook/integrity.py, the lease's
    bound) and are denied in every mode."""
    if not violations:
        return Outcome(True, result="allowed", mode=rule.mode)
    ids = sorted({v.rule for v in violations})
    hard = sorted(HARD_RULES.intersection(ids))
    if rule.mode == "enforce" or hard:
        message = _denial(violations, rule)
        if rule.mode != "enforce":
            message += f" (denied in {rule.mode} mode too: {hard} hold in every mode)"
        return Outcome(False, message=message, result="denied", rule_ids=ids, mode="enforce")
    if rule.mode == "warn":
        return Outcome(
            True,
            warnings=[f"sandman policy {rule.name!r} (warn): {v.text()}" for v in violations],
            result="warned",
            rule_ids=ids,
            mode=rule.mode,
        )
    log.info("audit: %s", _denial(violations, rule))
    return Outcome(True, result="audited", rule_ids=ids, mode=rule.mode)


def _validate_update(ctx: Context, r: Review, rule: RuleSet) -> Outcome:
    old, new = r.old or {}, r.obj
    if not is_sandbox(old) and not is_sandbox(new):
        return Outcome(True, result="skipped")
    refused = _claim_without_reuse(r, rule)
    if refused is not None:
        return refused
    violations = update_violations(
        old,
        new,
        rule,
        **_trusted(ctx),
        now=ctx.now(),
    )
    if not violations:
        return Outcome(True, result="allowed")
    # Contract breaches are denied in every mode; the rest follow it.
    return _apply_mode(violations, rule)


def _claim_without_reuse(r: Review, rule: RuleSet) -> Outcome | None:
    """Refuse a claim of a pod whose profile has ``reuse: false`` (eval: one
    fresh sandbox per task, so nobody's result depends on what ran before in
    it), in every mode, as the profile's other settings are applied in every
    mode. The daemon refuses /v1/reset for the same pods (``--no-reset``)."""

    def claimed(pod: dict[str, Any]) -> bool:
        lab = labels(pod)
        return lab.get(LABEL_CLAIM) == CLAIM_HELD or lab.get(LABEL_STATE) == STATE_CLAIMED

    old = r.old or {}
    if claimed(old) or not claimed(r.obj):
        return None
    prof = next(
        (p for p in (profile_of(old, rule), profile_of(r.obj, rule)) if p and not p.reuse), None
    )
    if prof is None:
        return None
    return Outcome(
        False,
        message=(
            f"sandman policy {rule.name!r}: [no-reuse] pod {_name(r)} has profile {prof.name!r}, "
            "whose sandboxes are used once (reuse: false) and cannot be claimed; fix: create "
            "a new sandbox for each task instead of claiming one from a pool"
        ),
        result="denied",
        rule_ids=["no-reuse"],
        mode="enforce",
    )


def _validate_delete(r: Review) -> Outcome:
    """Keep pool controllers off pods that were claimed out of a warm pool.

    A claim takes a pod out of its ReplicaSet atomically, but the ReplicaSet
    controller (scaling the pool down) and the garbage collector (deleting the
    pool) act on caches that may not have seen the claim yet, and would delete
    a sandbox that is now someone's. Denied, they retry on a fresh cache and
    pick an idle pod instead. Everyone else may delete a claimed pod.
    """
    old = r.old or {}
    held = (
        labels(old).get(LABEL_CLAIM) == CLAIM_HELD or labels(old).get(LABEL_STATE) == STATE_CLAIMED
    )
    if not held or r.username not in POOL_CONTROLLERS:
        return Outcome(True, result="skipped")
    name = f"{r.namespace}/{(old.get('metadata') or {}).get('name', '')}"
    return Outcome(
        False,
        message=(
            f"sandman claims: pod {name} was claimed from its warm pool "
            f"({LABEL_CLAIM}=held) and no longer belongs to it; {r.username} "
            "should pick another pod"
        ),
        result="denied",
        rule_ids=["claimed-pod"],
        mode="enforce",
    )


def unknown_namespace_denial(r: Review) -> Outcome | None:
    """The answer when the labels of ``r``'s namespace could not be read: a
    denial (retryable) for a sandbox's CREATE or UPDATE, whose rules those
    labels select; None (decide as usual) for everything else. Guessing the
    default rule would admit a sandbox under a laxer rule than its own."""
    if r.kind != "Pod" or r.operation not in ("CREATE", "UPDATE"):
        return None
    if r.namespace in PROTECTED_NAMESPACES:
        return None
    if not (is_sandbox(r.obj) or is_sandbox(r.old or {})):
        return None
    return Outcome(
        False,
        message=(
            f"sandman: [contract] the labels of namespace {r.namespace} could not be read, "
            "so the policy rules that apply there are unknown; retry"
        ),
        result="denied",
        rule_ids=["contract"],
        mode="enforce",
    )


def describe(r: Review) -> str:
    return _name(r)
