"""What an admin is told about a policy before it is applied (pure).

`sandman policy check` and `sandman install` read a policy with the
webhook's own parser (``parse_policy_text``) and these functions, so what
they say is what the webhook will do: the same parse errors (with the
field's path), the same denial texts for an image, and warnings for
policies that parse but would surprise on a real cluster. The one a fresh
install must never ship: a policy whose rule sets admit images only from a
loopback registry (``127.0.0.1:5000/*``, the local cluster's), under which
every real image is denied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sandman.contract import ANN_PROFILE
from sandman.imageref import InvalidImageRef, is_loopback_host, matching_pattern, pattern_host
from sandman.imageref import parse as parse_image
from sandman.webhook.checks import check
from sandman.webhook.policy import (
    DEFAULT_RULES,
    Policy,
    PolicyError,
    RuleSet,
    denial_text,
    parse_policy_text,
)
from sandman.webhook.policy_fields import load_yaml

POLICY_KEY = "policy.yaml"  # the ConfigMap key the webhook reads (policy_source.POLICY_KEY)
# Rules an image check can break whatever else the pod says.
IMAGE_RULES = ("registry", "profile")


def policy_text(text: str) -> str:
    """The policy in ``text``: a SandboxPolicy file as is, or the ``policy.yaml`` key
    of a ConfigMap manifest (``manifests/webhook/policy.yaml``); PolicyError otherwise."""
    doc = load_yaml(text) if text.strip() else None
    if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
        data = doc.get("data") or {}
        inner = data.get(POLICY_KEY) if isinstance(data, dict) else None
        if not isinstance(inner, str):
            raise PolicyError(f"the ConfigMap has no data.{POLICY_KEY} (the key the webhook reads)")
        return inner
    return text


def load(text: str) -> Policy:
    """The policy in ``text`` (a file or a ConfigMap manifest), parsed as the webhook does."""
    return parse_policy_text(policy_text(text))


def catch_all(rule: RuleSet) -> bool:
    """Whether ``rule`` governs every namespace (no selector)."""
    return not rule.match_labels and not rule.match_expressions


def loopback_only(rule: RuleSet) -> bool:
    """Whether every pattern of ``rule`` names a loopback registry (none is ``*``)."""
    hosts = [pattern_host(p) for p in rule.allowed_registries]
    return all(h is not None and is_loopback_host(h) for h in hosts)


def reachable(policy: Policy) -> list[RuleSet]:
    """The rule sets some namespace can get, in order; the built-in default last
    when no rule set governs every namespace."""
    out = []
    for rule in policy.rules:
        out.append(rule)
        if catch_all(rule):
            return out
    return [*out, DEFAULT_RULES]


def admits_only_loopback(policy: Policy) -> bool:
    """True when no namespace can run an image from outside a loopback registry:
    every rule set it can get enforces loopback-only registries."""
    return all(r.mode == "enforce" and loopback_only(r) for r in reachable(policy))


def selector_text(rule: RuleSet) -> str:
    if rule is DEFAULT_RULES:
        return "namespaces no rule set selects"
    if catch_all(rule):
        return "every namespace"
    parts = [f"{k}={v}" for k, v in rule.match_labels.items()]
    for key, op, values in rule.match_expressions:
        vals = f" ({','.join(values)})" if values else ""
        parts.append(f"{key} {op}{vals}")
    return "namespaces labelled " + ", ".join(parts)


def summary(policy: Policy) -> list[str]:
    """One line per rule set a namespace can get: mode, registries, profiles."""
    out = []
    for rule in reachable(policy):
        label = "built-in defaults" if rule is DEFAULT_RULES else f"rule set {rule.name!r}"
        out.append(
            f"{label} ({rule.mode}) for {selector_text(rule)}: registries "
            f"{', '.join(rule.allowed_registries)}; profiles {', '.join(rule.profiles)}"
        )
    return out


def warnings(policy: Policy, *, local_harness: bool = False) -> list[str]:
    """What parses but would surprise: every real image denied (unless ``local_harness``),
    every registry allowed, rule sets no namespace can reach."""
    out = []
    reach = reachable(policy)
    for rule in reach:
        name = "the built-in defaults" if rule is DEFAULT_RULES else f"rule set {rule.name!r}"
        if "*" in rule.allowed_registries:
            out.append(
                f"{name} allows images from every registry ('*'): name the registries your "
                "task images come from, e.g. docker.io/*, ghcr.io/ORG/*"
            )
        elif rule.mode == "enforce" and loopback_only(rule) and not local_harness:
            out.append(
                f"{name} admits images only from a loopback registry "
                f"({', '.join(rule.allowed_registries)}), which only the local harness "
                "cluster has: every other image is denied; list your registries, e.g. docker.io/*"
            )
    for rule in policy.rules[len(reach) :]:
        out.append(
            f"rule set {rule.name!r} never applies: rule set {reach[-1].name!r} before it "
            "selects every namespace (the first match wins)"
        )
    return out


@dataclass(frozen=True)
class ImageVerdict:
    rule: RuleSet
    admitted: bool
    message: str  # the webhook's denial or warning text, or which pattern admits


def _pod(image: str, profile: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"annotations": {ANN_PROFILE: profile}} if profile else {}
    return {"metadata": meta, "spec": {"containers": [{"name": "main", "image": image}]}}


def image_verdict(rule: RuleSet, image: str, profile: str | None = None) -> ImageVerdict:
    """Whether ``rule`` admits a sandbox of ``image`` (and ``profile``), in the webhook's words."""
    violations = [v for v in check(_pod(image, profile), rule) if v.rule in IMAGE_RULES]
    if violations:
        text = denial_text(violations, rule)
        if rule.mode == "enforce":
            return ImageVerdict(rule, False, f"denied: {text}")
        return ImageVerdict(rule, True, f"admitted in {rule.mode} mode, with: {text}")
    try:
        normal = parse_image(image).matchable
    except InvalidImageRef:  # never: the registry rule refuses it first
        normal = image
    pattern = matching_pattern(image, rule.allowed_registries)
    return ImageVerdict(
        rule,
        True,
        f"admitted: {normal} matches {pattern!r} of rule set {rule.name!r} ({rule.mode})",
    )


def image_verdicts(
    policy: Policy,
    image: str,
    profile: str | None = None,
    namespace_labels: dict[str, str] | None = None,
) -> list[ImageVerdict]:
    """The verdict of the rule set governing a namespace with ``namespace_labels``,
    or, without labels, of every rule set a namespace can get."""
    if namespace_labels is not None:
        return [image_verdict(policy.select(namespace_labels), image, profile)]
    return [image_verdict(r, image, profile) for r in reachable(policy)]
