"""The names and tags of Sandman's component images (one version string for all).

Every component image is ``REGISTRY[/PREFIX]/sandman-<component>:<version>``:
one flat repository name per component, because some registries (Docker Hub,
some ECR setups) allow a single path level under an account. The manifests
name the placeholders ``sandman-controller``, ``sandman-scheduler`` and
``sandman-daemon``; an overlay's ``images:`` (``sandman install`` writes one)
gives them a registry and the version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandman import __version__

# controller: the webhook, reaper and extender (one image, a subcommand each);
# scheduler: the stock kube-scheduler; daemon: what injected pods copy sandmand from.
COMPONENTS = ("controller", "scheduler", "daemon")

# The release this package is; `sandman image build` tags with it by default,
# and the committed manifests name it (tests/unit/install pins the two together).
RELEASE = __version__

# A tag per the distribution spec: [A-Za-z0-9_][A-Za-z0-9._-]{0,127}.
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
# host[:port] then optional path components (lowercase, the spec's separators).
_HOST = (
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*|\[[0-9a-fA-F:]+\])"
    r"(?::[0-9]+)?"
)
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REGISTRY = re.compile(rf"({_HOST})((?:/{_PATH})*)")


class ImageNameError(ValueError):
    """A registry or version that cannot make a valid image reference."""


def placeholder(component: str) -> str:
    """The image name the manifests use for ``component`` (``sandman-controller``)."""
    if component not in COMPONENTS:
        raise ImageNameError(f"unknown component {component!r}; known: {', '.join(COMPONENTS)}")
    return f"sandman-{component}"


@dataclass(frozen=True)
class Registry:
    """``REGISTRY[/PREFIX]`` as given on the command line, split and checked."""

    host: str  # "ghcr.io", "127.0.0.1:5000"
    prefix: str = ""  # "myorg/sandbox" or ""

    @classmethod
    def parse(cls, text: str) -> Registry:
        text = text.strip().rstrip("/")
        for scheme in ("https://", "http://", "docker://"):
            if text.startswith(scheme):
                raise ImageNameError(
                    f"registry {text!r}: give it without a scheme (e.g. ghcr.io/myorg); "
                    "plain HTTP is chosen with --insecure, never by URL"
                )
        m = _REGISTRY.fullmatch(text)
        if not m or not _qualified(m.group(1)):
            raise ImageNameError(
                f"registry {text!r} is not HOST[:PORT][/PREFIX] (the host needs a dot or a "
                "port, as in ghcr.io/myorg or 127.0.0.1:5000; path parts are lowercase)"
            )
        return cls(m.group(1), m.group(2).lstrip("/"))

    def __str__(self) -> str:
        return f"{self.host}/{self.prefix}" if self.prefix else self.host

    def repository(self, component: str) -> str:
        """``HOST[/PREFIX]/sandman-<component>`` (no tag)."""
        return f"{self}/{placeholder(component)}"

    def ref(self, component: str, version: str) -> str:
        return f"{self.repository(component)}:{check_version(version)}"

    @property
    def loopback(self) -> bool:
        host = self.host.rsplit(":", 1)[0] if not self.host.endswith("]") else self.host
        return host in ("localhost", "[::1]") or host.startswith("127.")


def _qualified(host: str) -> bool:
    # As docker decides whether a first path part is a registry host.
    return "." in host or ":" in host or host == "localhost"


def check_version(version: str) -> str:
    if not _TAG.fullmatch(version):
        raise ImageNameError(
            f"version {version!r} cannot be an image tag (letters, digits, '_', '.', '-'; "
            "at most 128, not starting with '.' or '-')"
        )
    return version
