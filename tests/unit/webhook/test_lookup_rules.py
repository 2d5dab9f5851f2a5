"""Which registries admission may read, and the fixed reasons a pod author sees."""

from __future__ import annotations

import pytest

from sandman.netguard import RefusedAddress, RegistryTimeout
from sandman.oci import (
    BadManifest,
    ImageNotFound,
    InvalidReference,
    NoMatchingPlatform,
    RegistryUnreachable,
    Unauthorized,
)
from sandman.webhook.lookup_rules import failure_reason, lookup_registry, named_host


@pytest.mark.parametrize(
    ("pattern", "host"),
    [
        ("ghcr.io/acme/*", "ghcr.io"),
        ("127.0.0.1:5000/*", "127.0.0.1:5000"),
        ("Index.Docker.IO/library/*", "docker.io"),  # Docker Hub's other name
        ("*", None),  # allows pulls from anywhere, names no host
        ("*.corp.example/*", None),  # a host glob names no host
        ("reg?.example/*", None),
        ("ghcr.io", None),  # no path: not a registry pattern
    ],
)
def test_named_host(pattern: str, host: str | None) -> None:
    assert named_host(pattern) == host


@pytest.mark.parametrize(
    ("image", "patterns", "want"),
    [
        ("127.0.0.1:5000/app:1", ("127.0.0.1:5000/*",), "127.0.0.1:5000"),
        ("ghcr.io/acme/app:1", ("*", "ghcr.io/acme/*"), "ghcr.io"),  # '*' adds nothing
        ("ghcr.io/other/app:1", ("ghcr.io/acme/*",), None),  # host named, path not matched
        ("ghcr.io/acme/app:1", ("*",), None),
        # the pattern's host must be the image's registry, not just match the text:
        # '127.0.0.1:5000/*' does not name 127.0.0.1:50001
        ("127.0.0.1:50001/app:1", ("127.0.0.1:5000/*",), None),
        # a short Docker Hub name is matched as the registry reads it
        ("ubuntu:22.04", ("docker.io/library/*",), "docker.io"),
        ("Not A Ref", ("*",), None),
    ],
)
def test_lookup_registry(image: str, patterns: tuple[str, ...], want: str | None) -> None:
    assert lookup_registry(image, patterns) == want


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (RefusedAddress("10.0.0.1:80: refused address (private)"), "refused address"),
        (RegistryTimeout("x did not answer within 10s"), "timed out"),
        (TimeoutError(), "timed out"),
        (RegistryUnreachable("x unreachable: [Errno 111] Connect call failed"), "unreachable"),
        (ImageNotFound("x: no such image (HTTP 404)"), "not found"),
        (
            Unauthorized("x requires credentials"),
            "unauthorized (the pod names no imagePullSecret this registry accepts)",
        ),
        (NoMatchingPlatform("index has arm64 only"), "no linux/amd64 image"),
        (InvalidReference("bad"), "invalid image reference"),
        (BadManifest("x: registry answered HTTP 400 <body>"), "bad response"),
        (RecursionError(), "bad response"),
    ],
)
def test_reasons_are_fixed_text(error: BaseException, reason: str) -> None:
    assert failure_reason(error) == reason
