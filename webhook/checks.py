"""The policy's checks: one small function per rule (pure: a pod and a rule set in).

``CHECKS`` reads like the denial table of docs/policy.md: each row names the
rule ids it may report and the function that looks for them. A check yields a
:class:`Violation` per breach (each names its rule and how to comply); a
compliant pod yields nothing. The validating webhook runs every row on the
final pod (after every mutation); ``review`` adds the UPDATE-only rules.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sandman.contract import (
    ANN_IDLE_TIMEOUT,
    ANN_PROFILE,
    ANN_TTL,
    ContractError,
    format_duration,
    parse_duration,
)
from sandman.imageref import InvalidImageRef, matching_pattern
from sandman.imageref import parse as parse_image
from sandman.quantity import parse_quantity
from sandman.webhook.confinement import (
    capabilities,
    capability,
    daemon_volumes,
    host_namespaces,
    host_paths,
    host_ports,
    privileged,
    probe_host,
    proc_mount,
    share_process_namespace,
    sysctls,
    unconfined,
)
from sandman.webhook.integrity import capability_drop, daemon_dir, dedicated_nodes, pool_state
from sandman.webhook.policy import RuleSet, Violation, profile_of
from sandman.webhook.subject import Check, Subject


def registry_allowed(image: str, patterns: tuple[str, ...]) -> bool:
    """Whether a pattern admits ``image`` as the runtime reads it (``python:3.11`` is
    ``docker.io/library/python:3.11``); a malformed reference is admitted by none."""
    return matching_pattern(image, patterns) is not None


# -- one function per row of the denial table ------------------------------------
def _registry(s: Subject) -> Iterator[Violation]:
    allowed = s.rule.allowed_registries
    for c in s.containers:
        image = c.get("image", "")
        if image in s.trusted_images:
            continue
        where = f"container {c.get('name', '?')}"
        try:
            ref = parse_image(image)
        except InvalidImageRef as e:
            # Not a reference the runtime would pull, so no registry to allow.
            yield Violation(
                "registry",
                f"{where}: image {image!r} is not a valid image reference: {e}",
                "write the image as [REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST], "
                "e.g. docker.io/library/python:3.11",
            )
            continue
        if matching_pattern(ref, allowed) is None:
            seen = "" if ref.matchable == image else f" ({ref.matchable})"
            yield Violation(
                "registry",
                f"{where}: image {image!r}{seen} is not from an allowed registry",
                f"use an image matching one of {list(allowed)}",
            )


# What reset's guarantees assume a sandbox never holds (daemon/API.md, "Trust
# boundary"): SYS_PTRACE reads the daemon's memory (its pristine record; the
# daemon makes itself non-dumpable, which only stops those without it), and
# SYS_TIME sets the clock that reset trusts to tell an unchanged file by its
# ctime. ALL and privileged grant both.
RESET_UNSAFE_CAPABILITIES = ("SYS_PTRACE", "SYS_TIME")


def _reset_capabilities(s: Subject) -> Iterator[Violation]:
    prof = profile_of(s.pod, s.rule)
    if prof is None or not prof.reuse:
        return  # unknown (the profile rule says so) or never reset
    fix = (
        f"or use a profile with reuse: false (one fresh sandbox per task); profile "
        f"{prof.name!r} is reset between uses"
    )
    # Only what the rule set grants: what it does not is the privileged and
    # capabilities rules' to refuse (one breach, one rule in the denial).
    granted = {capability(n) for n in s.rule.allowed_capabilities}
    for c in s.containers:
        name = c.get("name", "?")
        sc = c.get("securityContext") or {}
        if sc.get("privileged") and s.rule.allow_privileged:
            yield Violation(
                "reset-capabilities",
                f"container {name} is privileged (SYS_PTRACE and SYS_TIME included) in a "
                f"sandbox of profile {prof.name!r}, which is reused: reset could not vouch for it",
                f"remove securityContext.privileged, {fix}",
            )
            continue
        added = {capability(n) for n in (sc.get("capabilities") or {}).get("add") or []} & granted
        unsafe = [n for n in RESET_UNSAFE_CAPABILITIES if n in added or "ALL" in added]
        if unsafe:
            yield Violation(
                "reset-capabilities",
                f"container {name} adds {unsafe} in a sandbox of profile {prof.name!r}, which "
                "is reused: with them an agent can read the daemon's memory (SYS_PTRACE) or "
                "set the clock (SYS_TIME), and reset could not vouch for the sandbox",
                f"drop {unsafe} from securityContext.capabilities.add, {fix}",
            )


def _service_account_token(s: Subject) -> Iterator[Violation]:
    if s.rule.allow_service_account_token:
        return
    if s.spec.get("automountServiceAccountToken") is not False:
        yield Violation(
            "service-account-token",
            "the pod would mount a service-account token",
            "set spec.automountServiceAccountToken: false (sandboxes run untrusted code)",
        )
    for vol in s.spec.get("volumes") or []:
        for src in (vol.get("projected") or {}).get("sources") or []:
            if "serviceAccountToken" in src:
                yield Violation(
                    "service-account-token",
                    f"volume {vol.get('name')} projects a token",
                    "remove the serviceAccountToken projection",
                )


def _runtime_class(s: Subject) -> Iterator[Violation]:
    want, got = s.rule.runtime_class_name, s.spec.get("runtimeClassName")
    if want and got != want:
        yield Violation(
            "runtime-class",
            f"sandboxes here must run with runtimeClassName {want!r}, got {got!r}",
            f"set spec.runtimeClassName: {want}",
        )


def _resources_max(s: Subject) -> Iterator[Violation]:
    for c in s.containers:
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            for rname, value in (res.get(kind) or {}).items():
                cap = s.rule.max_resources.get(rname)
                if cap is None:
                    continue
                where = f"container {c.get('name', '?')}: {kind}.{rname}"
                try:
                    over = parse_quantity(str(value)) > parse_quantity(cap)
                except ValueError:
                    yield Violation(
                        "resources", f"{where}={value!r} is not a quantity", "use e.g. 500m, 2Gi"
                    )
                    continue
                if over:
                    yield Violation(
                        "resources-max",
                        f"{where}={value} is above the maximum {cap}",
                        f"ask for at most {cap} {rname}",
                    )


def _durations(s: Subject) -> Iterator[Violation]:
    ann = s.annotations
    for key, cap, rid in (
        (ANN_TTL, s.rule.max_ttl, "ttl"),
        (ANN_IDLE_TIMEOUT, s.rule.max_idle_timeout, "idle-timeout"),
    ):
        if key not in ann:
            continue
        try:
            d = parse_duration(ann[key], field=key)
        except ContractError as e:
            yield Violation(f"{rid}-format", str(e), f"fix annotation {key}")
            continue
        if cap is not None and d > cap:
            limit = format_duration(cap)
            yield Violation(
                f"{rid}-max",
                f"{key}={ann[key]} is above the maximum {limit}",
                f"set {key} to {limit} or less",
            )


def _profile(s: Subject) -> Iterator[Violation]:
    prof = profile_of(s.pod, s.rule)
    if prof is None:
        yield Violation(
            "profile",
            f"unknown profile {s.annotations.get(ANN_PROFILE)!r}",
            f"use one of {sorted(s.rule.profiles)} in annotation {ANN_PROFILE}",
        )
        return
    if not prof.guaranteed_qos:
        return
    for c in s.spec.get("containers") or []:
        r = c.get("resources") or {}
        req, lim = r.get("requests") or {}, r.get("limits") or {}
        if (
            not lim.get("cpu")
            or not lim.get("memory")
            or any(req.get(k, lim.get(k)) != lim.get(k) for k in ("cpu", "memory"))
        ):
            yield Violation(
                "guaranteed-qos",
                f"profile {prof.name}: container {c.get('name')} is not Guaranteed QoS",
                "set cpu and memory limits equal to requests",
            )


# The denial table (docs/policy.md), in its order: rule ids -> check.
CHECKS: tuple[tuple[tuple[str, ...], Check], ...] = (
    (("registry",), _registry),
    (("privileged", "privilege-escalation"), privileged),
    (("capabilities",), capabilities),
    (("capability-drop",), capability_drop),
    (("reset-capabilities",), _reset_capabilities),
    (("host-namespaces",), host_namespaces),
    (("host-ports",), host_ports),
    (("host-paths",), host_paths),
    (("probe-host",), probe_host),
    (("share-process-namespace",), share_process_namespace),
    (("seccomp", "apparmor", "selinux"), unconfined),
    (("proc-mount",), proc_mount),
    (("sysctls",), sysctls),
    (("daemon-volume",), daemon_volumes),
    (("daemon-dir",), daemon_dir),
    (("dedicated-nodes",), dedicated_nodes),
    (("pool-state",), pool_state),
    (("service-account-token",), _service_account_token),
    (("runtime-class",), _runtime_class),
    (("resources-max", "resources"), _resources_max),
    (("ttl-max", "ttl-format", "idle-timeout-max", "idle-timeout-format"), _durations),
    (("profile", "guaranteed-qos"), _profile),
)


def check(
    pod: dict[str, Any],
    rule: RuleSet,
    *,
    trusted_images: frozenset[str] = frozenset(),
    trusted_host_paths: frozenset[str] = frozenset(),
) -> list[Violation]:
    """Every way ``pod`` breaks ``rule`` (empty: compliant), in table order."""
    subject = Subject(pod, rule, trusted_images, trusted_host_paths)
    return [v for _ids, f in CHECKS for v in f(subject)]
