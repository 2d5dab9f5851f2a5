"""What each `sandman image` command needs on the machine, checked before it starts.

Images are built from this machine's own files (no Docker, no base image
pulls): Debian's python3.11 and its libraries, Go builds of upstream
binaries, a C compiler, busybox. A build that finds one missing halfway
through fails with a traceback or a half-built cache; so each command asks
:func:`missing` first and, if anything is absent, stops with
:func:`report`: every missing tool, what uses it and how to get it.
docs/install.md ("Prerequisites") lists the same table for users.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandman.harness.images import pybase
from sandman.install.images import COMPONENTS


@dataclass(frozen=True)
class Need:
    """One prerequisite: a command on PATH, an absolute path, an installed
    Debian package (``deb:NAME``) or a Python module of the running
    interpreter (``py:NAME``)."""

    what: str
    how: str  # how to get it
    why: str  # what uses it

    @property
    def label(self) -> str:
        kind, _, name = self.what.partition(":")
        if kind == "deb":
            return f"the Debian package {name}"
        if kind == "py":
            return f"{name} (in this Python)"
        return self.what


GO = Need(
    "go",
    "Go 1.24 or newer from https://go.dev/dl/ (Debian 12's golang is too old; with "
    "GOTOOLCHAIN=auto, the default, Go fetches the newer toolchain a module asks for); "
    "the build downloads modules from proxy.golang.org",
    "builds the binary from its pinned Go module",
)
PYTHON311 = Need(
    str(pybase.INTERPRETER),
    "apt-get install python3.11 (Debian 12's interpreter and standard library are copied "
    "into the image; another distribution's python3.11 is not supported)",
    "the image's Python runtime",
)
LDD = Need("ldd", "apt-get install libc-bin", "finds the libraries the interpreter links")
PIP = Need(
    "py:pip",
    "run sandman from a venv made with `python3 -m venv` (it has pip; `uv venv` needs "
    "--seed), or python3 -m ensurepip; the build downloads wheels from PyPI",
    "downloads pinned wheels",
)
DPKG = Need(
    "dpkg-query",
    "build on Debian 12 (bookworm) or a derivative: the image's files are Debian's packages",
    "lists the files and versions of the Debian packages copied into the image",
)
SKOPEO = Need(
    "skopeo",
    "apt-get install skopeo",
    "copies images to registries (auth, TLS) and writes docker archives",
)


def _debs(why: str) -> tuple[Need, ...]:
    return tuple(
        Need(f"deb:{p}", f"apt-get install {p}", why)
        for p in (*pybase.PACKAGES, *pybase.LIB_PACKAGES)
    )


# Image name -> what building it needs (components first, then the local
# cluster's add-on and test images).
IMAGE_NEEDS: dict[str, tuple[Need, ...]] = {
    "controller": (
        DPKG,
        PYTHON311,
        *_debs("the controller image's Python base layer"),
        LDD,
        PIP,
    ),
    "daemon": (PYTHON311, LDD, PIP),
    "scheduler": (GO,),
    "coredns": (GO,),
    "pause": (Need("gcc", "apt-get install gcc libc6-dev", "compiles the static pause binary"),),
    "tiny": (Need("/bin/busybox", "apt-get install busybox-static", "the image's only program"),),
    "entry": (Need("/bin/busybox", "apt-get install busybox-static", "the image's only program"),),
    "swe": (
        Need("debootstrap", "apt-get install debootstrap", "makes the image's Debian root"),
        Need("git", "apt-get install git", "makes the image's task repository"),
    ),
}


# Components for another architecture (`--arch`): Debian's packages for it,
# fetched from deb.debian.org and checked against Debian's keyring, unpacked
# with dpkg-deb (debs.py); its Go binaries are cross-compiled (Go as above).
FOREIGN_NEEDS = (
    Need(
        "gpgv",
        "apt-get install gpgv",
        "checks the signature of Debian's package indexes for the other architecture",
    ),
    Need(
        "/usr/share/keyrings/debian-archive-keyring.gpg",
        "apt-get install debian-archive-keyring",
        "the keys gpgv checks Debian's indexes with",
    ),
    Need(
        "dpkg-deb",
        "build on Debian 12 (bookworm) or a derivative",
        "unpacks Debian's packages for the other architecture",
    ),
)


def image_needs(
    names: Iterable[str], version: str | None = None, foreign: bool = False
) -> list[Need]:
    """What building ``names`` needs. ``version`` ``dev`` hashes every component's
    layers (components.dev_version), so it needs what all of them need;
    ``foreign``: some component is built for an architecture not this machine's."""
    wanted = list(names)
    if version == "dev":
        wanted += list(COMPONENTS)
    out: list[Need] = []
    extra = FOREIGN_NEEDS if foreign and any(n in COMPONENTS for n in wanted) else ()
    for need in (*(x for name in wanted for x in IMAGE_NEEDS.get(name, ())), *extra):
        if need not in out:
            out.append(need)
    return out


def command_needs(
    command: str, names: Iterable[str], version: str | None = None, foreign: bool = False
) -> list[Need]:
    """``build``: the images' needs; ``push`` and ``export`` add skopeo."""
    needs = image_needs(names, version, foreign)
    if command in ("push", "export"):
        needs.append(SKOPEO)
    return needs


# -- checking ---------------------------------------------------------------------
def installed_debs(names: Sequence[str]) -> set[str]:
    """Which of ``names`` dpkg says are installed (empty without dpkg)."""
    if not names or shutil.which("dpkg-query") is None:
        return set()
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${Status}\\n", *names],
        capture_output=True,
        text=True,
    )
    return {
        line.split(" ", 1)[0]
        for line in proc.stdout.splitlines()
        if line.endswith(" install ok installed")
    }


def probe(needs: Sequence[Need]) -> Callable[[Need], bool]:
    """The machine's answer for each need (one dpkg-query for all packages)."""
    debs = installed_debs([n.what[4:] for n in needs if n.what.startswith("deb:")])

    def present(need: Need) -> bool:
        kind, _, name = need.what.partition(":")
        if kind == "deb":
            return name in debs
        if kind == "py":
            return importlib.util.find_spec(name) is not None
        if need.what.startswith("/"):
            return Path(need.what).exists()
        return shutil.which(need.what) is not None

    return present


def missing(needs: Sequence[Need], present: Callable[[Need], bool]) -> list[Need]:
    return [n for n in needs if not present(n)]


def report(command: str, absent: Sequence[Need]) -> str:
    """The error for ``sandman image COMMAND`` when ``absent`` is not empty."""
    lines = [f"`sandman image {command}` cannot run here: missing"]
    debs = [n for n in absent if n.what.startswith("deb:")]
    for need in absent:
        if need not in debs:
            lines.append(f"  - {need.label}: {need.why}; get it: {need.how}")
    if debs:
        names = [n.what[4:] for n in debs]
        lines.append(
            f"  - Debian packages {', '.join(names)}: {debs[0].why}; "
            f"get them: apt-get install {' '.join(names)}"
        )
    lines.append("(docs/install.md, Prerequisites, lists what each command needs)")
    return "\n".join(lines)


def check(
    command: str, names: Iterable[str], version: str | None = None, foreign: bool = False
) -> str | None:
    """None if ``sandman image COMMAND NAMES`` has what it needs, else the error."""
    needs = command_needs(command, names, version, foreign)
    absent = missing(needs, probe(needs))
    return report(command, absent) if absent else None
