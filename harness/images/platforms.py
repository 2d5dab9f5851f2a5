"""The CPU architectures our images are built for, and what each one means on disk.

One name per architecture, the same in Go (``GOARCH``), Debian (``dpkg
--print-architecture``) and OCI (an image config's ``architecture``):
``amd64`` and ``arm64``. The rest is what a build needs to know about it:
the kernel's machine name (``uname -m``, manylinux wheel tags, qemu's
binary), the GNU triplet of Debian's multiarch library directory, the
dynamic loader and where the ABI puts it, and the OCI variant.

A build for the host's own architecture takes the host's files (its
python3.11, its libraries); any other comes from Debian's packages for that
architecture (``debs.py``) and Go's cross-compiler, and runs on the host only
under qemu-user.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


class UnknownArch(ValueError):
    pass


@dataclass(frozen=True)
class Arch:
    name: str  # GOARCH, Debian architecture and OCI architecture: "amd64", "arm64"
    machine: str  # uname -m, manylinux tags, qemu-<machine>: "x86_64", "aarch64"
    loader: str  # the dynamic loader's file name
    loader_dir: str  # where the ABI says the loader is ("lib64", "lib")
    variant: str = ""  # OCI platform variant ("v8" for arm64, as the spec lists it)

    @property
    def triplet(self) -> str:
        """Debian's multiarch directory name (``/usr/lib/<triplet>``)."""
        return f"{self.machine}-linux-gnu"

    @property
    def loader_path(self) -> str:
        """The loader's absolute path, as every ELF of this ABI names it."""
        return f"/{self.loader_dir}/{self.loader}"

    def platform(self) -> dict[str, Any]:
        """The OCI ``platform`` object of an index entry (no variant when unset)."""
        p: dict[str, Any] = {"architecture": self.name, "os": "linux"}
        if self.variant:
            p["variant"] = self.variant
        return p

    def __str__(self) -> str:
        return self.name


AMD64 = Arch("amd64", "x86_64", "ld-linux-x86-64.so.2", "lib64")
ARM64 = Arch("arm64", "aarch64", "ld-linux-aarch64.so.1", "lib", variant="v8")
ARCHES: dict[str, Arch] = {a.name: a for a in (AMD64, ARM64)}
_BY_MACHINE = {a.machine: a for a in ARCHES.values()}


def get(name: str) -> Arch:
    try:
        return ARCHES[name]
    except KeyError:
        raise UnknownArch(f"unknown architecture {name!r}; known: {', '.join(ARCHES)}") from None


def host(machine: str | None = None) -> Arch:
    """The architecture of this machine (``machine``: an ``uname -m`` answer)."""
    m = machine or os.uname().machine
    try:
        return _BY_MACHINE[m]
    except KeyError:
        raise UnknownArch(
            f"this machine is {m}; images are built on {', '.join(_BY_MACHINE)} only"
        ) from None


def parse_arches(text: str | None, default: Arch | None = None) -> tuple[Arch, ...]:
    """``--arch`` as typed (``amd64,arm64``; repeats and spaces allowed) -> arches,
    in the order given, each once; None or empty -> ``default`` (the host's)."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if not names:
        return (default or host(),)
    out: list[Arch] = []
    for n in names:
        a = get(n)
        if a not in out:
            out.append(a)
    return tuple(out)


def is_host(arch: Arch) -> bool:
    return arch == host()
