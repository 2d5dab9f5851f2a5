"""Image references as the runtime reads them, and registry globs on them: worked examples.

The expected normal forms are what github.com/distribution/reference's
ParseNormalizedNamed gives (what the kubelet and containerd pull), with the
``:latest`` the runtime adds when nothing is pinned.
"""

from __future__ import annotations

import pytest

from sandman.imageref import (
    InvalidImageRef,
    is_loopback_host,
    matching_pattern,
    normalize_pattern,
    parse,
    split_domain,
)

D = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("image", "matchable"),
    [
        # a single name is an official Docker Hub image
        ("python", "docker.io/library/python:latest"),
        ("python:3.11", "docker.io/library/python:3.11"),
        ("library/python:3.11", "docker.io/library/python:3.11"),
        ("docker.io/python:3.11", "docker.io/library/python:3.11"),
        ("docker.io/library/python:3.11", "docker.io/library/python:3.11"),
        # Docker Hub's legacy name is Docker Hub
        ("index.docker.io/library/python:3.11", "docker.io/library/python:3.11"),
        ("index.docker.io/python", "docker.io/library/python:latest"),
        # a first component without '.', ':' or upper case is a Hub namespace
        ("acme/tool:1", "docker.io/acme/tool:1"),
        ("acme/team/tool", "docker.io/acme/team/tool:latest"),
        # hosts: a dot, a port, localhost, or upper case
        ("ghcr.io/acme/tool:1", "ghcr.io/acme/tool:1"),
        ("127.0.0.1:5000/tiny", "127.0.0.1:5000/tiny:latest"),
        ("localhost/tiny:1", "localhost/tiny:1"),
        ("registry:5000/tiny", "registry:5000/tiny:latest"),
        ("[::1]:5000/tiny:1", "[::1]:5000/tiny:1"),
        ("GHCR.io/acme/tool:1", "ghcr.io/acme/tool:1"),  # hosts compare in lower case
        (
            "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/app:v2",
            "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/app:v2",
        ),
        # a digest pins: no :latest; tag and digest both stay
        (f"python@{D}", f"docker.io/library/python@{D}"),
        (f"python:3.11@{D}", f"docker.io/library/python:3.11@{D}"),
        # "localhost:5000" alone is a name and a tag (no '/'), as the runtime reads it
        ("localhost:5000", "docker.io/library/localhost:5000"),
    ],
)
def test_normal_forms(image: str, matchable: str) -> None:
    assert parse(image).matchable == matchable


def test_parts_and_str() -> None:
    ref = parse("python:3.11")
    assert (ref.domain, ref.path, ref.tag, ref.digest) == (
        "docker.io",
        "library/python",
        "3.11",
        None,
    )
    assert str(ref) == "docker.io/library/python:3.11"
    assert str(parse("python")) == "docker.io/library/python"  # ParseNormalizedNamed's String()
    assert split_domain("foo.com:5000/a/b") == ("foo.com:5000", "a/b")


@pytest.mark.parametrize(
    ("image", "why"),
    [
        ("", "empty"),
        ("Python:3.11", "must be lower case"),
        ("127.0.0.1:5000/Sandman/tiny:1", "must be lower case"),
        ("ab" * 32, "image ID"),
        ("python:3.11 ", "is not a tag"),
        ("python::1", "is not a tag"),
        ("python:" + "x" * 129, "is not a tag"),
        ("python@sha256:abc", "is not a digest"),
        ("python@sha256:" + "AB" * 32, "is not a digest"),  # lower-case hex only
        ("python@md5:" + "a" * 32, "is not a digest"),
        ("a//b", "is not a repository"),
        ("acme/-tool", "is not a repository"),
        ("127.0.0.1:5000.evil.example/x:1", "is not a registry host"),
        ("\uff11\uff12\uff17.0.0.1:5000/x:1", "is not a registry host"),  # full-width digits
        ("ghcr.io/" + "a" * 250, "longer than 255"),
    ],
)
def test_malformed_references_say_why(image: str, why: str) -> None:
    with pytest.raises(InvalidImageRef, match=why):
        parse(image)


@pytest.mark.parametrize(
    ("pattern", "normal"),
    [
        ("*", "*"),
        ("docker.io/*", "docker.io/*"),  # every Hub repository, not only official ones
        ("index.docker.io/*", "docker.io/*"),
        ("Index.Docker.IO/library/*", "docker.io/library/*"),
        ("docker.io/python:*", "docker.io/library/python:*"),  # one component: official
        ("acme/*", "docker.io/acme/*"),
        ("library/python:*", "docker.io/library/python:*"),
        ("GHCR.IO/acme/*", "ghcr.io/acme/*"),
        ("127.0.0.1:5000/*", "127.0.0.1:5000/*"),
    ],
)
def test_patterns_are_read_like_references(pattern: str, normal: str) -> None:
    assert normalize_pattern(pattern) == normal
    assert normalize_pattern(normal) == normal  # idempotent


@pytest.mark.parametrize(
    ("image", "patterns", "want"),
    [
        # the examples: familiar names are Docker Hub's
        ("python:3.11", ("docker.io/*",), "docker.io/*"),
        ("library/python:3.11", ("docker.io/*",), "docker.io/*"),
        ("python", ("docker.io/library/python:*",), "docker.io/library/python:*"),
        ("index.docker.io/library/python:3.11", ("docker.io/*",), "docker.io/*"),
        ("python:3.11", ("index.docker.io/*",), "docker.io/*"),
        ("acme/tool:1", ("acme/*",), "docker.io/acme/*"),
        # not Docker Hub, whatever the spelling
        ("ghcr.io/acme/tool:1", ("docker.io/*",), None),
        ("docker.io.evil.example/library/python:3.11", ("docker.io/*",), None),
        ("127.0.0.1:50001/tiny:1", ("127.0.0.1:5000/*",), None),
        ("localhost:5000/tiny:1", ("127.0.0.1:5000/*",), None),
        # '*' in a path glob crosses '/' as before
        ("ghcr.io/acme/team/tool:1", ("ghcr.io/acme/*",), "ghcr.io/acme/*"),
        ("ghcr.io/other/tool:1", ("ghcr.io/acme/*",), None),
        # an official-image pattern is not every Hub namespace
        ("acme/python:3", ("docker.io/python*",), None),
        ("python:3", ("docker.io/python*",), "docker.io/library/python*"),
        # the first matching pattern is named; a malformed image matches nothing
        ("python:3.11", ("ghcr.io/*", "*"), "*"),
        ("Not A Ref", ("*",), None),
    ],
)
def test_matching(image: str, patterns: tuple[str, ...], want: str | None) -> None:
    assert matching_pattern(image, patterns) == want


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1:5000", True),
        ("127.1.2.3", True),
        ("localhost:5000", True),
        ("[::1]:5000", True),
        ("10.244.0.1:5000", False),
        ("docker.io", False),
        ("ghcr.io", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback
