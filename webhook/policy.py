"""The cluster admin's sandbox policy: format, parsing, selection (pure).

A policy file holds rule sets; the first whose ``namespaceSelector`` matches
the pod's namespace labels governs it. A rule set supplies defaults (applied
by the mutating webhook) and limits (checked by the validating webhook on the
final object), in one of Pod Security Admission's modes: ``enforce`` denies,
``warn`` admits with warnings, ``audit`` admits and only counts and logs.
Every violation names its rule and says how to comply; the checks
themselves are a table in ``webhook/checks.py``. docs/policy.md has the
format with an example.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sandman.contract import (
    ANN_PROFILE,
    ContractError,
    annotations,
    parse_duration,
)
from sandman.quantity import parse_quantity

MODES = ("enforce", "warn", "audit")
RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage")


class PolicyError(ValueError):
    """The policy file itself is invalid (the webhook keeps the last good one)."""


@dataclass(frozen=True)
class Violation:
    rule: str  # stable id, e.g. "registry", "privileged", "ttl-max"
    message: str
    fix: str

    def text(self) -> str:
        return f"[{self.rule}] {self.message}; fix: {self.fix}"


@dataclass(frozen=True)
class Profile:
    name: str
    guaranteed_qos: bool = False
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    reuse: bool = True


@dataclass(frozen=True)
class RuleSet:
    name: str
    mode: str = "enforce"
    match_labels: dict[str, str] = field(default_factory=dict)
    match_expressions: tuple[dict[str, Any], ...] = ()
    allowed_registries: tuple[str, ...] = ("*",)
    runtime_class_name: str | None = None
    allow_privileged: bool = False
    allow_host_namespaces: bool = False
    allow_host_ports: bool = False
    allow_host_paths: bool = False
    allowed_capabilities: tuple[str, ...] = ()
    allow_service_account_token: bool = False
    allow_service_links: bool = False
    default_requests: dict[str, str] = field(default_factory=dict)
    default_limits: dict[str, str] = field(default_factory=dict)
    max_resources: dict[str, str] = field(default_factory=dict)
    default_ttl: dt.timedelta = dt.timedelta(hours=2)
    max_ttl: dt.timedelta = dt.timedelta(hours=24)
    default_idle_timeout: dt.timedelta | None = None
    max_idle_timeout: dt.timedelta | None = None
    profiles: dict[str, Profile] = field(default_factory=lambda: {"rollout": Profile("rollout")})
    default_profile: str = "rollout"

    def matches(self, ns_labels: dict[str, str]) -> bool:
        if any(ns_labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for expr in self.match_expressions:
            key, op, values = expr["key"], expr["operator"], expr.get("values") or []
            if op == "In" and ns_labels.get(key) not in values:
                return False
            if op == "NotIn" and ns_labels.get(key) in values:
                return False
            if op == "Exists" and key not in ns_labels:
                return False
            if op == "DoesNotExist" and key in ns_labels:
                return False
        return True


@dataclass(frozen=True)
class Policy:
    rules: tuple[RuleSet, ...]

    def select(self, ns_labels: dict[str, str]) -> RuleSet:
        for rule in self.rules:
            if rule.matches(ns_labels):
                return rule
        return DEFAULT_RULES


DEFAULT_RULES = RuleSet(name="built-in-default")


# -- parsing ---------------------------------------------------------------------
def _duration(d: dict[str, Any], key: str, default: dt.timedelta | None) -> dt.timedelta | None:
    if key not in d or d[key] is None:
        return default
    try:
        return parse_duration(str(d[key]), field=key)
    except ContractError as e:
        raise PolicyError(str(e)) from None


def _resources(d: dict[str, Any], what: str) -> dict[str, str]:
    out = {}
    for k, v in (d or {}).items():
        if k not in RESOURCE_NAMES:
            raise PolicyError(f"{what}: unknown resource {k!r} (use {', '.join(RESOURCE_NAMES)})")
        try:
            parse_quantity(str(v))
        except ValueError as e:
            raise PolicyError(f"{what}.{k}: {e}") from None
        out[k] = str(v)
    return out


def _rule(doc: dict[str, Any], index: int) -> RuleSet:
    known = {
        "name",
        "mode",
        "namespaceSelector",
        "allowedRegistries",
        "runtimeClassName",
        "allowPrivileged",
        "allowHostNamespaces",
        "allowHostPorts",
        "allowHostPaths",
        "allowedCapabilities",
        "allowServiceAccountToken",
        "allowServiceLinks",
        "resources",
        "ttl",
        "idleTimeout",
        "profiles",
        "defaultProfile",
    }
    unknown = set(doc) - known
    name = str(doc.get("name") or f"rules[{index}]")
    if unknown:
        raise PolicyError(f"rule {name}: unknown field(s) {', '.join(sorted(unknown))}")
    mode = doc.get("mode", "enforce")
    if mode not in MODES:
        raise PolicyError(f"rule {name}: mode must be one of {', '.join(MODES)}")
    sel = doc.get("namespaceSelector") or {}
    res = doc.get("resources") or {}
    ttl = doc.get("ttl") or {}
    idle = doc.get("idleTimeout") or {}
    profiles = {"rollout": Profile("rollout")}
    for pname, p in (doc.get("profiles") or {}).items():
        p = p or {}
        profiles[pname] = Profile(
            name=pname,
            guaranteed_qos=bool(p.get("guaranteedQoS", False)),
            node_selector=dict(p.get("nodeSelector") or {}),
            tolerations=tuple(p.get("tolerations") or ()),
            reuse=bool(p.get("reuse", True)),
        )
    default_profile = doc.get("defaultProfile", "rollout")
    if default_profile not in profiles:
        raise PolicyError(f"rule {name}: defaultProfile {default_profile!r} is not a profile")
    rule = RuleSet(
        name=name,
        mode=mode,
        match_labels=dict(sel.get("matchLabels") or {}),
        match_expressions=tuple(sel.get("matchExpressions") or ()),
        allowed_registries=tuple(doc.get("allowedRegistries") or ("*",)),
        runtime_class_name=doc.get("runtimeClassName"),
        allow_privileged=bool(doc.get("allowPrivileged", False)),
        allow_host_namespaces=bool(doc.get("allowHostNamespaces", False)),
        allow_host_ports=bool(doc.get("allowHostPorts", False)),
        allow_host_paths=bool(doc.get("allowHostPaths", False)),
        allowed_capabilities=tuple(doc.get("allowedCapabilities") or ()),
        allow_service_account_token=bool(doc.get("allowServiceAccountToken", False)),
        allow_service_links=bool(doc.get("allowServiceLinks", False)),
        default_requests=_resources((res.get("defaults") or {}).get("requests"), "requests"),
        default_limits=_resources((res.get("defaults") or {}).get("limits"), "limits"),
        max_resources=_resources(res.get("max"), "max"),
        default_ttl=_duration(ttl, "default", dt.timedelta(hours=2)),  # type: ignore[arg-type]
        max_ttl=_duration(ttl, "max", dt.timedelta(hours=24)),  # type: ignore[arg-type]
        default_idle_timeout=_duration(idle, "default", None),
        max_idle_timeout=_duration(idle, "max", None),
        profiles=profiles,
        default_profile=default_profile,
    )
    if rule.default_ttl > rule.max_ttl:
        raise PolicyError(f"rule {name}: ttl.default is above ttl.max")
    return rule


def parse_policy(doc: Any) -> Policy:
    if doc is None:
        return Policy(())
    if not isinstance(doc, dict):
        raise PolicyError("the policy must be a mapping with a `rules` list")
    if doc.get("kind", "SandboxPolicy") != "SandboxPolicy":
        raise PolicyError("kind must be SandboxPolicy")
    rules = doc.get("rules") or []
    if not isinstance(rules, list):
        raise PolicyError("rules must be a list")
    return Policy(tuple(_rule(r or {}, i) for i, r in enumerate(rules)))


# -- decisions -------------------------------------------------------------------
def profile_of(pod: dict[str, Any], rule: RuleSet) -> Profile | None:
    name = annotations(pod).get(ANN_PROFILE, rule.default_profile)
    return rule.profiles.get(name)
