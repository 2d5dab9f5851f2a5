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
import re
from dataclasses import dataclass, field
from typing import Any

from sandman.contract import ANN_PROFILE, POLICY_API_VERSION, annotations
from sandman.imageref import normalize_pattern
from sandman.webhook.policy_fields import (
    DNS_SUBDOMAIN_RE,
    LABEL_KEY_RE,
    LABEL_VALUE_RE,
    NAME_RE,
    Fields,
    PolicyError,
    check_str,
    load_yaml,
)

MODES = ("enforce", "warn", "audit")
RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage")
# Which scheduler places sandboxes (webhook/rewrite.py `scheduler_for`).
SCHEDULER_CHOICES = ("sandman", "pod", "default")
# Which sandboxes end with their command (webhook/rewrite.py `exits_with_command`).
EXIT_CHOICES = ("owner", "always", "never")
# How the daemon reaches sandboxes (webhook/mutate.py `delivery_for`).
DELIVERY_CHOICES = ("copy", "shared", "node")  # webhook/mutate.py DELIVERIES
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
TOLERATION_OPERATORS = ("Exists", "Equal")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
CAPABILITY_RE = re.compile(r"[A-Z][A-Z0-9_]*", re.ASCII)
DEFAULT_CAPABILITIES = (
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
)
SYSCTL_RE = re.compile(r"[a-z0-9_]+(\.[a-z0-9_-]+)*(\.\*)?", re.ASCII)
__all__ = ["PolicyError"]  # re-exported: callers catch it from here


@dataclass(frozen=True)
class Violation:
    rule: str  # stable id, e.g. "registry", "privileged", "ttl-max"
    message: str
    fix: str

    def text(self) -> str:
        return f"[{self.rule}] {self.message}; fix: {self.fix}"


def denial_text(violations: list[Violation], rule: RuleSet) -> str:
    """What a denial says (the webhook's answer, and `sandman policy check --image`)."""
    lines = "; ".join(v.text() for v in violations)
    return f"sandman policy {rule.name!r} ({rule.mode}): {lines}"


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
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # key, op, values
    allowed_registries: tuple[str, ...] = ("*",)
    runtime_class_name: str | None = None
    allow_privileged: bool = False
    allow_host_namespaces: bool = False
    allow_host_ports: bool = False
    allow_host_paths: bool = False
    allowed_capabilities: tuple[str, ...] = ()
    # What every container keeps without asking: containerd's default set
    # (pkg/oci/spec.go defaultUnixCaps) minus NET_RAW, with which a root agent
    # could forge ARP on the node's bridge and read its neighbours' traffic.
    default_capabilities: tuple[str, ...] = DEFAULT_CAPABILITIES
    allow_service_account_token: bool = False
    allow_service_links: bool = False
    # seccomp / AppArmor Unconfined, SELinux types outside the container ones.
    allow_unconfined: bool = False
    allowed_sysctls: tuple[str, ...] = ()  # beyond the safe set; "prefix.*" patterns
    allow_share_process_namespace: bool = False
    default_requests: dict[str, str] = field(default_factory=dict)
    default_limits: dict[str, str] = field(default_factory=dict)
    max_resources: dict[str, str] = field(default_factory=dict)
    default_ttl: dt.timedelta = dt.timedelta(hours=2)
    max_ttl: dt.timedelta = dt.timedelta(hours=24)
    default_idle_timeout: dt.timedelta | None = None
    max_idle_timeout: dt.timedelta | None = None
    profiles: dict[str, Profile] = field(default_factory=lambda: {"rollout": Profile("rollout")})
    default_profile: str = "rollout"
    scheduler: str = "sandman"
    exit_with_command: str = "owner"
    daemon_delivery: str | None = None  # None: the webhook's --daemon-delivery

    def matches(self, ns_labels: dict[str, str]) -> bool:
        if any(ns_labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for key, op, values in self.match_expressions:
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
def _registry_pattern(v: str, where: str) -> str:
    """``*`` or a glob whose registry host (before the first ``/``) is literal:
    ``127.0.0.1:5000*`` would also match ``127.0.0.1:50001/...``. Kept in the
    runtime's normal form (``sandman.imageref``), as images are matched:
    ``index.docker.io/python:*`` is ``docker.io/library/python:*``."""
    host, slash, _ = v.partition("/")
    if v != "*" and (not slash or any(ch in host for ch in "*?[]")):
        raise PolicyError(
            f"{where}: {v!r} must be '*' or name a registry host then a path, "
            "e.g. docker.io/*, ghcr.io/acme/* or 123456789012.dkr.ecr.us-east-1.amazonaws.com/*"
        )
    if any(ch.isspace() for ch in v):
        raise PolicyError(f"{where}: {v!r} contains white space")
    return normalize_pattern(v)


def _selector(f: Fields) -> tuple[dict[str, str], tuple[tuple[str, str, tuple[str, ...]], ...]]:
    labels = f.str_map("matchLabels", key_pattern=LABEL_KEY_RE, value_pattern=LABEL_VALUE_RE)
    exprs = []
    for i, raw in enumerate(f.items("matchExpressions") or []):
        e = Fields(raw, f"{f.path('matchExpressions')}[{i}]")
        key = e.text("key", None, pattern=LABEL_KEY_RE, what="label key")
        op = e.text("operator", None, choices=SELECTOR_OPERATORS)
        if key is None or op is None:
            raise PolicyError(f"{e.where}: needs a key and an operator")
        values = e.str_list("values", pattern=LABEL_VALUE_RE, what="label value") or ()
        if op in ("In", "NotIn") and not values:
            raise PolicyError(f"{e.where}: operator {op} needs values")
        if op in ("Exists", "DoesNotExist") and values:
            raise PolicyError(f"{e.where}: operator {op} takes no values")
        e.done()
        exprs.append((key, op, values))
    f.done()
    return labels, tuple(exprs)


def _toleration(raw: Any, where: str) -> dict[str, Any]:
    t = Fields(raw, where)
    out: dict[str, Any] = {}
    for k, v in (
        ("key", t.text("key", None, pattern=LABEL_KEY_RE, what="taint key")),
        ("operator", t.text("operator", None, choices=TOLERATION_OPERATORS)),
        ("value", t.text("value", None, pattern=LABEL_VALUE_RE, what="taint value")),
        ("effect", t.text("effect", None, choices=TAINT_EFFECTS)),
    ):
        if v is not None:
            out[k] = v
    secs = t.raw("tolerationSeconds")
    if secs is not None:
        if isinstance(secs, bool) or not isinstance(secs, int) or not 0 <= secs < 2**31:
            raise PolicyError(f"{t.path('tolerationSeconds')}: expected seconds, got {secs!r}")
        out["tolerationSeconds"] = secs
    t.done()
    return out


def _profile(raw: Any, name: str, where: str) -> Profile:
    p = Fields(raw, where)
    tolerations = tuple(
        _toleration(t, f"{p.path('tolerations')}[{i}]")
        for i, t in enumerate(p.items("tolerations") or [])
    )
    prof = Profile(
        name=name,
        guaranteed_qos=p.flag("guaranteedQoS", False),
        node_selector=p.str_map(
            "nodeSelector", key_pattern=LABEL_KEY_RE, value_pattern=LABEL_VALUE_RE
        ),
        tolerations=tolerations,
        reuse=p.flag("reuse", True),
    )
    p.done()
    return prof


def _rule(raw: Any, index: int) -> RuleSet:
    f = Fields(raw, f"rules[{index}]")
    name = f.text("name", None, pattern=NAME_RE, what="name (letters, digits, . _ -)")
    name = name or f"rules[{index}]"
    f.where = f"rule {name}"
    res, ttl, idle = f.sub("resources"), f.sub("ttl"), f.sub("idleTimeout")
    defaults = res.sub("defaults")
    labels, exprs = _selector(f.sub("namespaceSelector"))
    profiles = {"rollout": Profile("rollout")}
    pf = f.sub("profiles")
    for pname in list(pf.doc):
        check_str(pname, pf.path(pname), pattern=NAME_RE, what="profile name")
        profiles[pname] = _profile(pf.raw(pname), pname, pf.path(pname))
    patterns = f.str_list("allowedRegistries")
    if patterns == ():
        raise PolicyError(
            f"{f.path('allowedRegistries')}: an empty list would allow no image; "
            "omit the field to allow every registry, or list patterns"
        )
    registries = tuple(
        _registry_pattern(v, f"{f.path('allowedRegistries')}[{i}]")
        for i, v in enumerate(patterns or ("*",))
    )
    caps = f.str_list("allowedCapabilities", pattern=CAPABILITY_RE, what="capability (NET_ADMIN)")
    keep = f.str_list("defaultCapabilities", pattern=CAPABILITY_RE, what="capability (CHOWN)")
    rule = RuleSet(
        name=name,
        mode=f.text("mode", "enforce", choices=MODES) or "enforce",
        match_labels=labels,
        match_expressions=exprs,
        allowed_registries=registries,
        runtime_class_name=f.text(
            "runtimeClassName", None, pattern=DNS_SUBDOMAIN_RE, what="RuntimeClass name"
        ),
        allow_privileged=f.flag("allowPrivileged", False),
        allow_host_namespaces=f.flag("allowHostNamespaces", False),
        allow_host_ports=f.flag("allowHostPorts", False),
        allow_host_paths=f.flag("allowHostPaths", False),
        allowed_capabilities=caps or (),
        default_capabilities=DEFAULT_CAPABILITIES if keep is None else keep,
        allow_service_account_token=f.flag("allowServiceAccountToken", False),
        allow_service_links=f.flag("allowServiceLinks", False),
        allow_unconfined=f.flag("allowUnconfined", False),
        allowed_sysctls=f.str_list("allowedSysctls", pattern=SYSCTL_RE, what="sysctl name") or (),
        allow_share_process_namespace=f.flag("allowShareProcessNamespace", False),
        default_requests=defaults.quantities("requests", RESOURCE_NAMES),
        default_limits=defaults.quantities("limits", RESOURCE_NAMES),
        max_resources=res.quantities("max", RESOURCE_NAMES),
        default_ttl=ttl.duration("default", dt.timedelta(hours=2)),  # type: ignore[arg-type]
        max_ttl=ttl.duration("max", dt.timedelta(hours=24)),  # type: ignore[arg-type]
        # A maximum with no default is the default: else a pod that names no
        # idle timeout would have none, past the maximum.
        default_idle_timeout=idle.duration("default", None) or idle.duration("max", None),
        max_idle_timeout=idle.duration("max", None),
        profiles=profiles,
        default_profile=f.text("defaultProfile", "rollout") or "rollout",
        scheduler=f.text("scheduler", "sandman", choices=SCHEDULER_CHOICES) or "sandman",
        exit_with_command=f.text("exitWithCommand", "owner", choices=EXIT_CHOICES) or "owner",
        daemon_delivery=f.text("daemonDelivery", None, choices=DELIVERY_CHOICES),
    )
    for sub in (defaults, res, ttl, idle, pf, f):
        sub.done()
    if rule.default_profile not in profiles:
        raise PolicyError(f"rule {name}: defaultProfile {rule.default_profile!r} is not a profile")
    if rule.default_ttl > rule.max_ttl:
        raise PolicyError(f"rule {name}: ttl.default is above ttl.max")
    if (
        rule.default_idle_timeout is not None
        and rule.max_idle_timeout is not None
        and rule.default_idle_timeout > rule.max_idle_timeout
    ):
        raise PolicyError(f"rule {name}: idleTimeout.default is above idleTimeout.max")
    return rule


def parse_policy(doc: Any) -> Policy:
    """A policy from its parsed document; PolicyError names the field that is wrong."""
    if doc is None:
        return Policy(())
    top = Fields(doc, "")
    api = top.text("apiVersion", None)
    if api is not None and api != POLICY_API_VERSION:
        raise PolicyError(f"apiVersion must be {POLICY_API_VERSION}, got {api!r}")
    if top.text("kind", "SandboxPolicy") != "SandboxPolicy":
        raise PolicyError("kind must be SandboxPolicy")
    top.raw("metadata")  # allowed (a name, labels), not read
    rules = tuple(_rule(r, i) for i, r in enumerate(top.items("rules") or []))
    top.done()
    names = [r.name for r in rules]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise PolicyError(f"rule names must be unique (denials name them): {', '.join(dup)}")
    return Policy(rules)


def parse_policy_text(text: str) -> Policy:
    """A policy from the file's text (YAML or JSON); PolicyError for anything else."""
    return parse_policy(load_yaml(text) if text.strip() else None)


# -- decisions -------------------------------------------------------------------
def profile_of(pod: dict[str, Any], rule: RuleSet) -> Profile | None:
    name = annotations(pod).get(ANN_PROFILE, rule.default_profile)
    return rule.profiles.get(name)
