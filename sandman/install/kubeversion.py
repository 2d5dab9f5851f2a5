"""Which Kubernetes versions an install supports (pure: versions in, a verdict out).

Sandman runs a second kube-scheduler, the stock binary. Kubernetes' version
skew policy says a kube-scheduler must not be newer than the apiserver it
talks to, and may be one minor older (meant for upgrades: the control plane
first, then its schedulers). This release's ``sandman-scheduler`` image is
kube-scheduler 1.34 (``SCHEDULER_MINOR``, the Kubernetes the harness builds
and every test tier runs). For the apiserver's ``/version``:

    v1.34.4               the release's scheduler image; supported and tested
    v1.35.0               the release's image, with a warning: within the skew
                          policy (one minor older), not tested
    v1.33.9-eks-1f3d7c2   refused (the scheduler would be newer), naming the
                          matching upstream image to pass instead:
                          --scheduler-image registry.k8s.io/kube-scheduler:v1.33.9
    v1.36.1               refused: two minors apart (same advice)
    v1.29.5               refused: below the manifests' floor, 1.30 (the
                          webhook's preStop `sleep` action, admissionregistration
                          v1 ValidatingAdmissionPolicy)

``--scheduler-image REF`` is held to the same rule, by the Kubernetes
version its tag carries (``v1.33.9``, or ``...-k8s1.33`` for a build of
one's own); a tag that carries none is refused, since nothing else says
which kube-scheduler it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# The kube-scheduler minor in this release's sandman-scheduler image; a unit
# test keeps it equal to the harness's Kubernetes (harness/cluster/config.py).
SCHEDULER_MINOR = (1, 34)
# The oldest apiserver the manifests themselves work with.
FLOOR = (1, 30)
# Where Kubernetes publishes its own kube-scheduler images (multi-arch,
# `kube-scheduler` on PATH: what the manifests run).
UPSTREAM = "registry.k8s.io/kube-scheduler"

# "v1.34.4", "v1.30.14-eks-1f3d7c2", "v1.31.2-gke.1200000", "1.34"
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")
# The Kubernetes version an image tag carries: "v1.33.9" or "0.1.0-k8s1.33".
_TAG_VERSION = re.compile(r"(?:^v|-k8s)(\d+)\.(\d+)(?:\.(\d+))?")


class VersionError(ValueError):
    pass


@dataclass(frozen=True, order=True)
class KubeVersion:
    major: int
    minor: int
    patch: int = 0
    text: str = ""  # as the apiserver said it (gitVersion)

    @property
    def minor_text(self) -> str:
        return f"{self.major}.{self.minor}"

    @classmethod
    def parse(cls, text: str) -> KubeVersion:
        """``v1.34.4``, ``1.34`` or a provider's ``v1.30.14-eks-1f3d7c2``."""
        m = _VERSION.match(text.strip())
        if not m:
            raise VersionError(f"{text!r} is not a Kubernetes version (like v1.34.4 or 1.34)")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0), text.strip())

    @classmethod
    def from_server(cls, doc: dict[str, Any]) -> KubeVersion:
        """From the apiserver's ``/version`` body. ``gitVersion`` first: some
        providers' ``minor`` reads ``"30+"``."""
        if doc.get("gitVersion"):
            return cls.parse(str(doc["gitVersion"]))
        try:
            major = int(str(doc["major"]).rstrip("+"))
            minor = int(str(doc["minor"]).rstrip("+"))
        except (KeyError, ValueError):
            raise VersionError(f"the apiserver's /version names no version: {doc}") from None
        return cls(major, minor, 0, f"v{major}.{minor}")


def split_image(ref: str) -> tuple[str, str]:
    """``(name, tag)`` of ``HOST[:PORT]/PATH:TAG`` (the tag is required)."""
    name, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag or "@" in ref or not name:
        raise VersionError(
            f"scheduler image {ref!r}: give it as NAME:TAG, the tag naming its Kubernetes "
            f"version (e.g. {UPSTREAM}:v1.33.9)"
        )
    return name, tag


def image_minor(ref: str) -> tuple[int, int]:
    """The Kubernetes minor a scheduler image's tag carries."""
    _, tag = split_image(ref)
    m = _TAG_VERSION.search(tag)
    if not m:
        raise VersionError(
            f"scheduler image {ref!r}: its tag carries no Kubernetes version (v1.33.9, or "
            "VERSION-k8s1.33 for a build of your own), so which kube-scheduler it is is unknown"
        )
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class Verdict:
    ok: bool
    message: str  # what the install prints (a warning when ok but untested)
    tested: bool = False


def supported_range(scheduler: tuple[int, int] = SCHEDULER_MINOR) -> str:
    """``1.34 (tested) and 1.35 ...`` for a 1.34 scheduler: what refusals say."""
    major, minor = scheduler
    return f"{major}.{minor} (tested) and {major}.{minor + 1} (skew policy, untested)"


def matching_upstream(server: KubeVersion) -> str:
    """Kubernetes' own kube-scheduler image of the apiserver's exact release."""
    return f"{UPSTREAM}:v{server.major}.{server.minor}.{server.patch}"


def check(server: KubeVersion, scheduler_image: str | None = None) -> Verdict:
    """May this install's kube-scheduler (the release's image, or
    ``scheduler_image``) serve this apiserver? Raises VersionError for an
    image whose tag says no version."""
    custom = scheduler_image is not None
    sched = image_minor(scheduler_image) if scheduler_image else SCHEDULER_MINOR
    what = (
        f"kube-scheduler {sched[0]}.{sched[1]} ({scheduler_image})"
        if custom
        else f"the release's kube-scheduler {sched[0]}.{sched[1]} (sandman-scheduler)"
    )
    here = server.text or f"v{server.minor_text}"
    advice = (
        f"Pass a kube-scheduler of the apiserver's own release: --scheduler-image "
        f"{matching_upstream(server)} (Kubernetes' image; Sandman tests only "
        f"{SCHEDULER_MINOR[0]}.{SCHEDULER_MINOR[1]})."
    )
    if (server.major, server.minor) < FLOOR:
        return Verdict(
            False, f"the apiserver is {here}; Sandman needs Kubernetes {FLOOR[0]}.{FLOOR[1]}+"
        )
    if server.major != sched[0] or server.minor < sched[1]:
        return Verdict(
            False,
            f"the apiserver is {here}, older than {what}: Kubernetes' skew policy never "
            f"has a scheduler newer than its apiserver (this one serves apiservers "
            f"{supported_range(sched)}). {advice}",
        )
    if server.minor > sched[1] + 1:
        return Verdict(
            False,
            f"the apiserver is {here}, more than one minor newer than {what} (Kubernetes' "
            f"skew policy allows one; this one serves {supported_range(sched)}). {advice}",
        )
    tested = not custom and server.minor == sched[1]
    if tested:
        return Verdict(True, f"apiserver {here}, {what}: supported and tested", tested=True)
    if server.minor == sched[1]:
        return Verdict(True, f"apiserver {here}, {what}: the same minor (untested by Sandman)")
    return Verdict(
        True,
        f"warning: apiserver {here} with {what}, one minor older: within Kubernetes' skew "
        f"policy, not tested. {advice}",
    )
