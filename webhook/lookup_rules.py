"""Which registries admission may read, and what a pod author is told about a lookup (pure).

A lookup makes the webhook connect to the host an image names, and the pod
author writes the image. So the webhook asks only registries the admin
named: a pattern in the governing rule set's ``allowedRegistries`` whose
host part is spelled out (``ghcr.io/org/*``, ``127.0.0.1:5000/*``). ``*``
and host globs (``*.example.com/*``) let pods *pull* from many places; they
never make the webhook connect to them. This holds in every mode: a warn or
audit rule admits the pod, but its lookup would connect all the same.

What a registry answered stays in the webhook's log: a pod author sees a
fixed reason class ("not found", "timed out", ...), never a response body
or a socket error, so that a lookup cannot read anything back from a host.
"""

from __future__ import annotations

from sandman.imageref import InvalidImageRef, matching_pattern, pattern_host
from sandman.imageref import parse as parse_image
from sandman.netguard import RefusedAddress, RegistryTimeout
from sandman.oci import (
    BadManifest,
    ConfigTooLarge,
    ImageNotFound,
    InvalidReference,
    NoMatchingPlatform,
    RegistryError,
    RegistryUnreachable,
    Unauthorized,
)

GLOB_CHARS = frozenset("*?[]")


def named_host(pattern: str) -> str | None:
    """The registry host a pattern spells out (``ghcr.io/org/*`` -> ``ghcr.io``,
    ``acme/*`` -> ``docker.io``, as the runtime reads it), else None."""
    host, slash, _ = pattern.partition("/")
    if not slash or not host or GLOB_CHARS & set(host):
        return None
    return pattern_host(pattern)


def lookup_registry(image: str, patterns: tuple[str, ...]) -> str | None:
    """The registry of ``image`` when a pattern names its host and matches the image
    as the runtime reads it (``ubuntu`` is ``docker.io/library/ubuntu:latest``), else None."""
    try:
        ref = parse_image(image)
    except InvalidImageRef:
        return None
    domain = ref.domain.lower()
    for p in patterns:
        if named_host(p) == domain and matching_pattern(ref, (p,)) is not None:
            return ref.domain
    return None


def not_named_message(registry: str, rule: str) -> str:
    return (
        f"image config lookup skipped for {registry}: rule {rule!r} does not name this "
        "registry for lookups (only allowedRegistries patterns with the host spelled out, "
        f"such as '{registry}/REPOSITORY/*', are; '*' and host globs are not); name it "
        "there, or set `command` on the container"
    )


def failure_reason(error: BaseException) -> str:
    """A short fixed class for a failed lookup; never text a registry or socket chose."""
    if isinstance(error, RefusedAddress):
        return "refused address"
    if isinstance(error, RegistryTimeout | TimeoutError):
        return "timed out"
    if isinstance(error, RegistryUnreachable):
        return "unreachable"
    if isinstance(error, ImageNotFound):
        return "not found"
    if isinstance(error, Unauthorized):
        return "unauthorized (the pod names no imagePullSecret this registry accepts)"
    if isinstance(error, NoMatchingPlatform):
        return "no linux/amd64 image"
    if isinstance(error, InvalidReference):
        return "invalid image reference"
    if isinstance(error, ConfigTooLarge):
        return ConfigTooLarge.REASON  # fixed text: the limits and the fix
    if isinstance(error, BadManifest | RecursionError | RegistryError):
        return "bad response"
    return "internal error"


def failure_message(registry: str, reason: str) -> str:
    return f"image config lookup failed for {registry}: {reason}"


# Failures that say the host, not the image, is in trouble: the next lookup
# of any image there would wait the same way (``HostFailures``).
HOST_FAILURE_REASONS = frozenset({"timed out", "unreachable"})
