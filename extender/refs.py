"""Image references in one canonical spelling (pure; no I/O).

A pod may say ``nginx``, a kubelet reports ``docker.io/library/nginx:latest``
and ``docker.io/library/nginx@sha256:...`` for the same bytes. Matching the
strings as written makes every short name look absent from every node, which
is the failure this module prevents. The rules are those of
``github.com/distribution/reference`` (``ParseNormalizedNamed`` /
``TagNameOnly``), which both containerd and the kubelet use:

- no domain, or a first component without ``.`` or ``:`` that is not
  ``localhost`` (and is lowercase): the domain is ``docker.io``;
- ``index.docker.io`` is ``docker.io``; a one-component path on docker.io gets
  ``library/``;
- no tag and no digest: the tag is ``latest``;
- a digest names the content: with one, the tag is irrelevant to what is
  pulled (containerd resolves the digest), so the key is ``name@digest``;
- ``host:5000/repo`` is a registry with a port, never a tag.

The domain split is ``sandman.imageref``'s, the one the policy matches with;
this module adds what placement needs: node-report keys, and leniency for
data from the API (runtime ID schemes, any digest algorithm).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandman import imageref

DEFAULT_TAG = imageref.DEFAULT_TAG

# The grammar of distribution/reference (regexp.go), anchored.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_PATH = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_DOMAIN_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"^(?:{_DOMAIN_LABEL}(?:\.{_DOMAIN_LABEL})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}$")
# A bare image ID ("sha256:<64 hex>" or 64 hex): content, but no repository.
_IMAGE_ID = re.compile(r"^(?:sha256:)?[a-f0-9]{64}$")
# Runtime prefixes seen in containerStatuses[].imageID (dockershim, cri-dockerd).
_ID_SCHEMES = ("docker-pullable://", "docker://")


class InvalidReference(ValueError):
    """Not an image reference; the message says which part is wrong."""


@dataclass(frozen=True)
class ImageRef:
    """A normalised reference: ``domain/path[:tag][@digest]``."""

    domain: str
    path: str
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        return f"{self.domain}/{self.path}"

    @property
    def key(self) -> str:
        """What a node reporting this image lists: ``name@digest`` or ``name:tag``."""
        if self.digest:
            return f"{self.name}@{self.digest}"
        return f"{self.name}:{self.tag or DEFAULT_TAG}"

    @property
    def content_key(self) -> str | None:
        """The content alone (``@sha256:...``): equal bytes under any repository."""
        return f"@{self.digest}" if self.digest else None

    @property
    def ident(self) -> str:
        """One string per distinct image: the content if known, else the key."""
        return self.content_key or self.key


def parse(ref: str) -> ImageRef:
    """Normalise ``ref``; raises InvalidReference for anything else."""
    text = ref.strip()
    for scheme in _ID_SCHEMES:
        text = text.removeprefix(scheme)
    if not text:
        raise InvalidReference("empty image reference")
    if _IMAGE_ID.match(text):
        raise InvalidReference(f"{ref!r} is an image ID, not a reference")
    name, at, digest = text.partition("@")
    if at and not _DIGEST.match(digest):
        raise InvalidReference(f"{ref!r}: bad digest {digest!r}")
    domain, remainder = imageref.split_domain(name)
    path, tag = remainder, None
    colon = remainder.rfind(":")
    if colon > remainder.rfind("/"):
        path, tag = remainder[:colon], remainder[colon + 1 :]
        if not _TAG.match(tag):
            raise InvalidReference(f"{ref!r}: bad tag {tag!r}")
    if not _DOMAIN.match(domain):
        raise InvalidReference(f"{ref!r}: bad registry {domain!r}")
    if not _PATH.match(path):
        raise InvalidReference(f"{ref!r}: bad repository {path!r} (lowercase, [a-z0-9._-/])")
    return ImageRef(domain, path, tag, digest or None)


def try_parse(ref: str | None) -> ImageRef | None:
    """``parse`` for data from the API, where a bad name is skipped, not fatal."""
    if not ref:
        return None
    try:
        return parse(ref)
    except InvalidReference:
        return None
