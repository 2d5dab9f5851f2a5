"""Image references as the container runtime reads them, and registry globs on them (pure).

A pod says ``python:3.11``; the kubelet and containerd pull
``docker.io/library/python:3.11``. A policy that matched the string as
written would deny that image under ``docker.io/*`` and could be argued
around with spellings (``index.docker.io/...``, ``library/...``). So images
and the policy's patterns are both put in the runtime's normal form first,
with the rules of github.com/distribution/reference's ``ParseNormalizedNamed``
(what the kubelet and containerd parse with):

- no ``/``: a Docker Hub official image, ``python`` -> ``docker.io/library/python``;
- the part before the first ``/`` is a registry host when it is ``localhost``,
  contains ``.`` or ``:``, or has an upper-case letter; otherwise the whole
  name is a Docker Hub repository: ``acme/tool`` -> ``docker.io/acme/tool``;
- ``index.docker.io`` is ``docker.io``; a one-component repository on
  Docker Hub gets ``library/``: ``docker.io/python`` -> ``docker.io/library/python``;
- the repository is lower-case; a 64-hex-digit string is an image ID, not a name;
  the name is at most 255 characters; a tag is ``[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}``;
  a digest is ``ALGORITHM:HEX`` with sha256 (64), sha384 (96) or sha512 (128)
  lower-case hex digits.

What is matched is :attr:`ImageRef.matchable`: the normal form with the tag
the runtime pulls (``:latest`` when there is neither tag nor digest), the
registry host in lower case (hosts are case-insensitive; paths are not).
"""

from __future__ import annotations

import fnmatch
import functools
import ipaddress
import re
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
LEGACY_DOCKER_HUB = "index.docker.io"
OFFICIAL_PREFIX = "library/"
DEFAULT_TAG = "latest"
MAX_NAME = 255  # distribution/reference NameTotalLengthMax
GLOB_CHARS = frozenset("*?[]")

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_REMOTE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?")
_TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_IDENTIFIER = re.compile(r"[a-f0-9]{64}")
_DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}


class InvalidImageRef(ValueError):
    """Not an image reference the runtime would pull; the message says what is wrong."""


@dataclass(frozen=True)
class ImageRef:
    domain: str  # as written (after docker.io normalisation)
    path: str  # the repository, e.g. library/python
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        return f"{self.domain}/{self.path}"

    @property
    def matchable(self) -> str:
        """``host/path:tag[@digest]``, host lower-cased, ``:latest`` when nothing is pinned."""
        out = f"{self.domain.lower()}/{self.path}"
        tag = self.tag or (None if self.digest else DEFAULT_TAG)
        if tag:
            out += f":{tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def split_domain(name: str) -> tuple[str, str]:
    """(registry host, remainder) of a name as the runtime splits it (docker.io filled in)."""
    first, slash, rest = name.partition("/")
    if not slash:
        return DOCKER_HUB, OFFICIAL_PREFIX + name
    if first == LEGACY_DOCKER_HUB:
        domain, remainder = DOCKER_HUB, rest
    elif first == "localhost" or any(c in first for c in ".:") or first.lower() != first:
        domain, remainder = first, rest
    else:
        domain, remainder = DOCKER_HUB, name
    if domain == DOCKER_HUB and "/" not in remainder:
        remainder = OFFICIAL_PREFIX + remainder
    return domain, remainder


def parse(image: str) -> ImageRef:
    """``image`` in the runtime's normal form, or InvalidImageRef saying why not."""
    if not image:
        raise InvalidImageRef("empty image reference")
    if _IDENTIFIER.fullmatch(image):
        raise InvalidImageRef(
            "a 64-hex-digit image ID, not a name (name the image, e.g. REPOSITORY@sha256:DIGEST)"
        )
    domain, remainder = split_domain(image)
    # As ParseNormalizedNamed: the repository (before the first ':') must be
    # lower case, said before the grammar's generic complaint.
    remote = remainder.split(":", 1)[0]
    if remote.lower() != remote:
        raise InvalidImageRef(f"the repository {remote!r} must be lower case")
    rest, at, digest = remainder.partition("@")
    path, colon, tag = rest.partition(":")
    if not _DOMAIN.fullmatch(domain):
        raise InvalidImageRef(f"{domain!r} is not a registry host")
    if not _REMOTE.fullmatch(path):
        raise InvalidImageRef(
            f"{path!r} is not a repository (lower-case components of "
            "[a-z0-9] separated by '.', '_', '__' or '-', joined by '/')"
        )
    if colon and not _TAG.fullmatch(tag):
        raise InvalidImageRef(f"{tag!r} is not a tag ([A-Za-z0-9_.-], at most 128)")
    if at:
        algorithm, _, hexdigits = digest.partition(":")
        want = _DIGEST_HEX.get(algorithm)
        if want is None or len(hexdigits) != want or not re.fullmatch(r"[a-f0-9]+", hexdigits):
            raise InvalidImageRef(
                f"{digest!r} is not a digest (sha256: and 64 lower-case hex digits)"
            )
    if len(domain) + 1 + len(path) > MAX_NAME:
        raise InvalidImageRef(f"the name is longer than {MAX_NAME} characters")
    return ImageRef(domain, path, tag if colon else None, digest if at else None)


# -- registry patterns -------------------------------------------------------------
@functools.lru_cache(maxsize=1024)
def normalize_pattern(pattern: str) -> str:
    """A policy glob in the same normal form as images (idempotent).

    ``*`` stays. The host part is read like an image's (``acme/*`` is
    ``docker.io/acme/*``, ``index.docker.io/*`` is ``docker.io/*``) and lower-cased;
    on Docker Hub, one path component that starts with a literal is an
    official image (``docker.io/python:*`` -> ``docker.io/library/python:*``),
    while ``docker.io/*`` stays every repository there.
    """
    if pattern == "*":
        return pattern
    domain, remainder = _split_pattern(pattern)
    return f"{domain.lower()}/{remainder}"


def _split_pattern(pattern: str) -> tuple[str, str]:
    first, slash, rest = pattern.partition("/")
    if not slash:
        return DOCKER_HUB, pattern  # no host: refused by the policy parser before here
    if first.lower() == LEGACY_DOCKER_HUB:
        domain, remainder = DOCKER_HUB, rest
    elif first == "localhost" or any(c in first for c in ".:") or first.lower() != first:
        domain, remainder = first, rest
    else:
        domain, remainder = DOCKER_HUB, pattern
    if domain.lower() == DOCKER_HUB and "/" not in remainder and remainder[:1] not in GLOB_CHARS:
        remainder = OFFICIAL_PREFIX + remainder
    return domain, remainder


def matching_pattern(image: str | ImageRef, patterns: tuple[str, ...]) -> str | None:
    """The first pattern (normalised) that admits ``image``; None for none, or a malformed image."""
    try:
        ref = image if isinstance(image, ImageRef) else parse(image)
    except InvalidImageRef:
        return None
    text = ref.matchable
    for p in patterns:
        norm = normalize_pattern(p)
        if fnmatch.fnmatchcase(text, norm):
            return norm
    return None


def pattern_host(pattern: str) -> str | None:
    """The registry host a normalised pattern names, None for ``*``."""
    if pattern == "*":
        return None
    return normalize_pattern(pattern).partition("/")[0]


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address, with or without a port: a registry only the
    node itself reaches (the local cluster's ``127.0.0.1:5000``)."""
    if host.startswith("["):
        name = host[1:].split("]", 1)[0]
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
