"""The cluster admin's sandbox policy: format, selection, defaults, checks (pure).

A policy file holds rule sets; the first whose ``namespaceSelector`` matches
the pod's namespace labels governs it. A rule set supplies defaults (applied
by the mutating webhook) and limits (checked by the validating webhook on the
final object), in one of Pod Security Admission's modes: ``enforce`` denies,
``warn`` admits with warnings, ``audit`` admits and only counts and logs.
Every violation names its rule and says how to comply. docs/policy.md has
the format with an example.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from dataclasses import dataclass, field
from typing import Any

from sandman.contract import (
    ANN_IDLE_TIMEOUT,
    ANN_PROFILE,
    ANN_TTL,
    ContractError,
    annotations,
    format_duration,
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


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def registry_allowed(image: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(image, p) for p in patterns)


def check(
    pod: dict[str, Any],
    rule: RuleSet,
    *,
    trusted_images: frozenset[str] = frozenset(),
    now: dt.datetime | None = None,
) -> list[Violation]:
    """Every way ``pod`` breaks ``rule`` (empty: compliant)."""
    v: list[Violation] = []
    spec = pod.get("spec") or {}
    ann = annotations(pod)
    for c in _containers(pod):
        name, image = c.get("name", "?"), c.get("image", "")
        if image not in trusted_images and not registry_allowed(image, rule.allowed_registries):
            v.append(
                Violation(
                    "registry",
                    f"container {name}: image {image!r} is not from an allowed registry",
                    f"use an image matching one of {list(rule.allowed_registries)}",
                )
            )
        sc = c.get("securityContext") or {}
        if sc.get("privileged") and not rule.allow_privileged:
            v.append(
                Violation(
                    "privileged",
                    f"container {name} is privileged",
                    "remove securityContext.privileged",
                )
            )
        if sc.get("allowPrivilegeEscalation") and not rule.allow_privileged:
            v.append(
                Violation(
                    "privilege-escalation",
                    f"container {name} allows privilege escalation",
                    "remove securityContext.allowPrivilegeEscalation",
                )
            )
        added = set(((sc.get("capabilities") or {}).get("add")) or [])
        extra = sorted(added - set(rule.allowed_capabilities))
        if extra:
            v.append(
                Violation(
                    "capabilities",
                    f"container {name} adds capabilities {extra}",
                    "drop them from securityContext.capabilities.add "
                    f"(allowed: {list(rule.allowed_capabilities)})",
                )
            )
        if not rule.allow_host_ports and any(p.get("hostPort") for p in c.get("ports") or []):
            v.append(
                Violation(
                    "host-ports", f"container {name} uses a hostPort", "remove ports[].hostPort"
                )
            )
        v += _check_resources(name, c.get("resources") or {}, rule)
    if not rule.allow_host_namespaces:
        for f in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(f):
                v.append(Violation("host-namespaces", f"spec.{f} is set", f"remove spec.{f}"))
    if not rule.allow_host_paths:
        for vol in spec.get("volumes") or []:
            if "hostPath" in vol:
                v.append(
                    Violation(
                        "host-paths",
                        f"volume {vol.get('name')} is a hostPath",
                        "use an emptyDir or a PVC instead",
                    )
                )
    if not rule.allow_service_account_token:
        if spec.get("automountServiceAccountToken") is not False:
            v.append(
                Violation(
                    "service-account-token",
                    "the pod would mount a service-account token",
                    "set spec.automountServiceAccountToken: false (sandboxes run untrusted code)",
                )
            )
        for vol in spec.get("volumes") or []:
            for src in (vol.get("projected") or {}).get("sources") or []:
                if "serviceAccountToken" in src:
                    v.append(
                        Violation(
                            "service-account-token",
                            f"volume {vol.get('name')} projects a token",
                            "remove the serviceAccountToken projection",
                        )
                    )
    if rule.runtime_class_name and spec.get("runtimeClassName") != rule.runtime_class_name:
        v.append(
            Violation(
                "runtime-class",
                f"sandboxes here must run with runtimeClassName "
                f"{rule.runtime_class_name!r}, got {spec.get('runtimeClassName')!r}",
                f"set spec.runtimeClassName: {rule.runtime_class_name}",
            )
        )
    v += _check_durations(ann, rule)
    prof = profile_of(pod, rule)
    if prof is None:
        v.append(
            Violation(
                "profile",
                f"unknown profile {ann.get(ANN_PROFILE)!r}",
                f"use one of {sorted(rule.profiles)} in annotation {ANN_PROFILE}",
            )
        )
    elif prof.guaranteed_qos:
        for c in spec.get("containers") or []:
            r = c.get("resources") or {}
            req, lim = r.get("requests") or {}, r.get("limits") or {}
            if (
                not lim.get("cpu")
                or not lim.get("memory")
                or any(req.get(k, lim.get(k)) != lim.get(k) for k in ("cpu", "memory"))
            ):
                v.append(
                    Violation(
                        "guaranteed-qos",
                        f"profile {prof.name}: container {c.get('name')} is not Guaranteed QoS",
                        "set cpu and memory limits equal to requests",
                    )
                )
    return v


def _check_resources(name: str, res: dict[str, Any], rule: RuleSet) -> list[Violation]:
    out = []
    for kind in ("requests", "limits"):
        for rname, value in (res.get(kind) or {}).items():
            cap = rule.max_resources.get(rname)
            if cap is None:
                continue
            try:
                over = parse_quantity(str(value)) > parse_quantity(cap)
            except ValueError:
                out.append(
                    Violation(
                        "resources",
                        f"container {name}: {kind}.{rname}={value!r} is not a quantity",
                        "use e.g. 500m, 2Gi",
                    )
                )
                continue
            if over:
                out.append(
                    Violation(
                        "resources-max",
                        f"container {name}: {kind}.{rname}={value} is above the maximum {cap}",
                        f"ask for at most {cap} {rname}",
                    )
                )
    return out


def _check_durations(ann: dict[str, str], rule: RuleSet) -> list[Violation]:
    out = []
    for key, cap, rid in (
        (ANN_TTL, rule.max_ttl, "ttl-max"),
        (ANN_IDLE_TIMEOUT, rule.max_idle_timeout, "idle-timeout-max"),
    ):
        if key not in ann:
            continue
        try:
            d = parse_duration(ann[key], field=key)
        except ContractError as e:
            out.append(Violation(rid.replace("-max", "-format"), str(e), f"fix annotation {key}"))
            continue
        if cap is not None and d > cap:
            limit = format_duration(cap)
            out.append(
                Violation(
                    rid,
                    f"{key}={ann[key]} is above the maximum {limit}",
                    f"set {key} to {limit} or less",
                )
            )
    return out
