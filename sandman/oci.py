"""OCI image content, pure: references, platforms, indexes, image configs.

The parts of the distribution and image specs that need no network, so that
the registry client (``sandman.registry``) stays I/O and these stay testable
one by one. Exceptions (all ``RegistryError``; the client raises the rest)::

    RegistryError
    ├── InvalidReference      the string is no image reference (also a ValueError)
    ├── RegistryUnreachable   connect/DNS/TLS failure, no answer in time, 429 or 5xx
    ├── Unauthorized          401/403 with the credentials we had (or without any)
    ├── ImageNotFound         404 for the manifest or the config blob
    ├── NoMatchingPlatform    an index without the wanted platform
    └── BadManifest           unsupported or malformed content, digest mismatch, too large
        └── ConfigTooLarge    an image config over what Sandman reads from one
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sandman import imageref

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join((*INDEX_TYPES, *MANIFEST_TYPES))

DOCKER_HUB = imageref.DOCKER_HUB
DOCKER_HUB_API = "registry-1.docker.io"

DIGEST_RE = re.compile(r"^sha256:[a-f0-9]{64}$")


class RegistryError(Exception):
    """Base class; ``retryable`` says whether the same call may succeed later."""

    retryable = False


class InvalidReference(RegistryError, ValueError):
    pass


class RegistryUnreachable(RegistryError):
    retryable = True


class Unauthorized(RegistryError):
    pass


class ImageNotFound(RegistryError):
    pass


class NoMatchingPlatform(RegistryError):
    pass


class BadManifest(RegistryError):
    pass


class ConfigTooLarge(BadManifest):
    """An image config over the bounds Sandman reads (``check_argv``, WORKDIR, and the
    client's ``MAX_CONFIG_BYTES``). ``REASON`` is fixed text, safe to show a pod author
    (nothing in it is chosen by the registry); the message adds the numbers."""

    REASON = (
        "image config over the limits Sandman reads (ENTRYPOINT+CMD at most 256 words, "
        "16 KiB each, 64 KiB in all; WORKDIR at most 4 KiB; the config at most 1 MiB); "
        "give the container an explicit `command`"
    )


# -- references ------------------------------------------------------------------
@dataclass(frozen=True)
class Reference:
    """A normalised reference: ``domain/path[:tag][@digest]`` (docker.io/library/... filled in)."""

    domain: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, ref: str) -> Reference:
        """``ref`` as the runtime reads it (sandman.imageref, the policy's parser
        too); the registry client also takes only sha256 digests, which it verifies."""
        try:
            r = imageref.parse(ref.strip())
        except imageref.InvalidImageRef as e:
            raise InvalidReference(f"{ref!r}: {e}") from None
        if r.digest and not DIGEST_RE.match(r.digest):
            raise InvalidReference(f"{ref!r}: bad digest {r.digest!r} (sha256:<64 hex>)")
        return cls(r.domain, r.path, r.tag, r.digest)

    @property
    def name(self) -> str:
        return f"{self.domain}/{self.path}"

    @property
    def manifest_ref(self) -> str:
        """What goes after ``/manifests/``: the digest when pinned, else the tag."""
        return self.digest or self.tag or "latest"

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.domain == DOCKER_HUB else self.domain

    def with_digest(self, digest: str) -> Reference:
        return Reference(self.domain, self.path, self.tag, digest)

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def plain_http(host: str, insecure: Iterable[str] = ()) -> bool:
    """Whether to talk HTTP: loopback and ``localhost`` (as docker and containerd
    default to), and the hosts an admin listed; everything else is HTTPS."""
    if host in insecure:
        return True
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1:].split("]")[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


# -- content ---------------------------------------------------------------------
@dataclass(frozen=True)
class Platform:
    os: str = "linux"
    architecture: str = "amd64"
    variant: str | None = None

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


LINUX_AMD64 = Platform()


def select_manifest(index: dict[str, Any], platform: Platform = LINUX_AMD64) -> dict[str, Any]:
    """The descriptor of ``platform`` in an image index (pure).

    An exact variant wins; otherwise the first entry of the right OS and
    architecture (amd64 images rarely set a variant; containerd's matcher
    does the same). Attestation manifests (``unknown/unknown``) never match.
    """
    entries = [m for m in index.get("manifests") or [] if isinstance(m, dict)]
    candidates = []
    for m in entries:
        p = m.get("platform") or {}
        if p.get("os") == platform.os and p.get("architecture") == platform.architecture:
            candidates.append(m)
    if platform.variant:
        exact = [
            m for m in candidates if (m.get("platform") or {}).get("variant") == platform.variant
        ]
        candidates = exact or candidates
    if not candidates:
        have = sorted(
            {
                "/".join(
                    x
                    for x in ((m.get("platform") or {}).get(k) for k in ("os", "architecture"))
                    if x
                )
                or "?"
                for m in entries
            }
        )
        raise NoMatchingPlatform(
            f"the index has no {platform} image (has: {', '.join(have) or 'none'})"
        )
    return candidates[0]


# What Sandman reads of an image config: the argv (ENTRYPOINT then CMD) and
# WORKDIR, bounded, because the webhook keeps them in its cache and puts the
# argv into the pod's command. Real images run a handful of words (the
# harness's images: 1 to 7; `sh -c "<script>"` images: a few KB in one word);
# the kernel allows 128 KiB per word and 2 MiB in all, but an argv that large
# is a file baked into an image, which belongs in the pod's own `command`.
# 256 words, 16 KiB each, 64 KiB in all: an order of magnitude above real
# images, while a cached entry stays under about 80 KB (argv plus per-word
# overhead) and the pod object far below the apiserver's 1.5 MiB.
MAX_ARGV_WORDS = 256
MAX_ARGV_WORD_BYTES = 16 << 10
MAX_ARGV_BYTES = 64 << 10
# Linux PATH_MAX.
MAX_WORKING_DIR_BYTES = 4096
_FIX = "give the container an explicit `command` (and `args`) instead"


def _utf8_len(word: str) -> int:
    # JSON may carry lone surrogates ("\ud800"); count them, do not fail on them.
    return len(word.encode("utf-8", "surrogatepass"))


def check_argv(entrypoint: tuple[str, ...], cmd: tuple[str, ...]) -> None:
    """Refuse an ENTRYPOINT+CMD over the caps (pure); the error names the cap and the fix."""
    words = len(entrypoint) + len(cmd)
    if words > MAX_ARGV_WORDS:
        raise ConfigTooLarge(
            f"the image config's Entrypoint+Cmd has {words} words, over the "
            f"{MAX_ARGV_WORDS} Sandman reads from an image; {_FIX}"
        )
    total = 0
    for word in (*entrypoint, *cmd):
        n = _utf8_len(word)
        if n > MAX_ARGV_WORD_BYTES:
            raise ConfigTooLarge(
                f"the image config's Entrypoint+Cmd has a {n}-byte word, over the "
                f"{MAX_ARGV_WORD_BYTES} bytes per word Sandman reads from an image; {_FIX}"
            )
        total += n
    if total > MAX_ARGV_BYTES:
        raise ConfigTooLarge(
            f"the image config's Entrypoint+Cmd is {total} bytes, over the "
            f"{MAX_ARGV_BYTES} Sandman reads from an image; {_FIX}"
        )


@dataclass(frozen=True)
class ImageConfig:
    """How an image runs, as far as Sandman needs it (None: not set in the image).

    Only ENTRYPOINT, CMD and WORKDIR, bounded (``check_argv``): the webhook
    caches these for every image it has seen, and it once kept every field of
    a config (Env included) whatever its size, so that a few hostile multi-MB
    configs held hundreds of MB in each replica until it was OOM-killed and
    every sandbox create failed. Immutable, so safe to share.
    """

    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None
    working_dir: str = ""

    @classmethod
    def from_bytes(cls, blob: bytes) -> ImageConfig:
        """Parse a config blob; the parsed document is dropped on return, only
        the bounded fields stay."""
        try:
            doc = json.loads(blob)
        except RecursionError:
            # the C decoder's answer to "[[[[..." nested deeper than the stack
            raise BadManifest("the image config is nested too deeply to parse") from None
        except ValueError:
            raise BadManifest("the image config is not JSON") from None
        return cls.from_blob(doc)

    @classmethod
    def from_blob(cls, doc: Any) -> ImageConfig:
        if not isinstance(doc, dict):
            raise BadManifest("the image config is not a JSON object")
        c = doc.get("config") or {}
        if not isinstance(c, dict):
            raise BadManifest("the image config's `config` is not an object")

        def argv(key: str) -> tuple[str, ...] | None:
            v = c.get(key)
            if v is None:
                return None
            if not isinstance(v, list):
                raise BadManifest(f"the image config's {key} is not a list of strings")
            if len(v) > MAX_ARGV_WORDS:  # before walking a list of a million words
                raise ConfigTooLarge(
                    f"the image config's {key} has {len(v)} words, over the "
                    f"{MAX_ARGV_WORDS} Sandman reads from an image; {_FIX}"
                )
            if not all(isinstance(x, str) for x in v):
                raise BadManifest(f"the image config's {key} is not a list of strings")
            return tuple(v)

        entrypoint, cmd = argv("Entrypoint"), argv("Cmd")
        check_argv(entrypoint or (), cmd or ())
        wd = c.get("WorkingDir")
        if wd is not None and not isinstance(wd, str):
            raise BadManifest("the image config's WorkingDir is not a string")
        if wd and _utf8_len(wd) > MAX_WORKING_DIR_BYTES:
            raise ConfigTooLarge(
                f"the image config's WorkingDir is over {MAX_WORKING_DIR_BYTES} bytes "
                f"(Linux PATH_MAX); set the container's `workingDir` and `command` instead"
            )
        return cls(entrypoint=entrypoint, cmd=cmd, working_dir=wd or "")


@dataclass(frozen=True)
class ResolvedImage:
    reference: Reference
    digest: str  # what the reference names now (an index's digest for multi-arch images)
    manifest_digest: str  # the platform's image manifest
    config: ImageConfig


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
