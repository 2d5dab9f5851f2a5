"""A minimal Python runtime layer made from Debian's own packages (no base image to pull).

Distroless-style: Debian's ``python3.11`` interpreter and standard library
(exactly the files ``dpkg -L`` lists for its three packages, minus what a
server never imports), the shared libraries they link against (found with
``ldd``, copied under their sonames), CA certificates, a non-root user and
``/tmp``. No shell, no package manager, no libc tools.

Every ``.py`` gets an *unchecked-hash* ``.pyc`` at build time: layers carry a
fixed mtime (``oci.EPOCH``), so timestamp-checked bytecode would always look
stale, and a read-only root filesystem could not cache the recompiled
result; every start would compile the standard library again.

The layer is keyed by the Debian versions of every package it copies from
(``dpkg-query``), so a security update of libssl3 or python3.11 rebuilds it.

For another architecture (arm64) the same layer is made from Debian's
packages for it (``debs.py``: the same package names, unpacked into a cached
sysroot, keyed by their files' hashes): the interpreter, the standard
library and the libraries its kept modules load (read from the ELF files, as
``ldd`` cannot run them), the loader at that architecture's ABI path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from sandman.harness.images import debs, platforms
from sandman.harness.images.platforms import Arch

PYTHON = "python3.11"
INTERPRETER = Path("/usr/bin") / PYTHON
STDLIB = Path("/usr/lib") / PYTHON
# Where pip-installed packages go in the image: on Debian's python3.11
# sys.path by default, so no PYTHONPATH is needed.
SITE_PACKAGES = Path("/usr/local/lib") / PYTHON / "dist-packages"
MULTIARCH = Path("/usr/lib/x86_64-linux-gnu")
LOADER = "ld-linux-x86-64.so.2"

# The interpreter and its standard library, as Debian splits them.
PACKAGES = ("python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib")
# The packages of the libraries ldd finds for the kept modules (and
# EXTRA_LIBS),
# plus the CA bundle: part of the key only.
LIB_PACKAGES = (
    "libc6",
    "libssl3",
    "libffi8",
    "zlib1g",
    "libexpat1",
    "libbz2-1.0",
    "liblzma5",
    "libuuid1",
    "libgcc-s1",
    "ca-certificates",
)
# glibc's compatibility stubs (empty since 2.34, but manylinux wheels built on
# older glibc still list them as NEEDED: cryptography's Rust module does).
EXTRA_LIBS = ("libgcc_s.so.1", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libutil.so.1")

# Standard-library packages a server never imports; each is dead weight in
# every pull (tests alone are ~12 MB with their data in the full suite).
PRUNE_DIRS = frozenset(
    {
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "pydoc_data",
        "venv",
        "sqlite3",
        "curses",
        "dbm",
        "config-3.11-x86_64-linux-gnu",
    }
)
# Extension modules left out, with the libraries they would pull in:
# test modules, readline/curses (libreadline, libncursesw, libtinfo),
# sqlite3 (libsqlite3, 1.5 MB), dbm/gdbm, NIS (libnsl, libtirpc), crypt
# (libcrypt), OSS audio.
PRUNE_MODULES = (
    "_test",
    "_ctypes_test",
    "_xxtestfuzz",
    "_xxsubinterpreters",
    "xxlimited",
    "readline",
    "_curses",
    "_sqlite3",
    "_dbm",
    "_gdbm",
    "nis",
    "_crypt",
    "ossaudiodev",
)

# Revision of this recipe: bump when the layer's contents change for reasons
# the package versions do not capture.
REVISION = 2


class PyBaseError(RuntimeError):
    pass


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PyBaseError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def package_versions() -> list[str]:
    """``name=version`` of every package the layer copies from, in a fixed order."""
    fmt = "${Package}=${Version}\\n"
    names = [*PACKAGES, *LIB_PACKAGES]
    proc = subprocess.run(["dpkg-query", "-W", f"-f={fmt}", *names], capture_output=True, text=True)
    found = sorted(line for line in proc.stdout.splitlines() if line)
    missing = sorted(set(names) - {line.split("=", 1)[0] for line in found})
    if missing:
        raise PyBaseError(
            f"Debian packages missing for the Python base layer: {', '.join(missing)} "
            f"(apt-get install {' '.join(missing)})"
        )
    return found


def layer_key() -> str:
    h = hashlib.sha256(f"revision={REVISION}\n".encode())
    for line in package_versions():
        h.update(line.encode() + b"\n")
    return f"pybase-{PYTHON}-{h.hexdigest()[:16]}"


def _pruned(path: Path) -> bool:
    try:
        rel = path.relative_to(STDLIB)
    except ValueError:
        return False
    if rel.parts and rel.parts[0] in PRUNE_DIRS:
        return True
    if rel.parts[:1] == ("lib-dynload",):
        return path.name.startswith(PRUNE_MODULES)
    return "__pycache__" in rel.parts


def _package_files() -> list[Path]:
    out = []
    for pkg in PACKAGES:
        for line in _run(["dpkg-query", "-L", pkg]).splitlines():
            p = Path(line)
            if p == INTERPRETER or (p.is_relative_to(STDLIB) and not _pruned(p)):
                out.append(p)
    return sorted(set(out))


def _copy_into(root: Path, src: Path, dest: Path | None = None) -> None:
    target = root / (dest or src).relative_to("/")
    if src.is_symlink():
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() and not target.is_symlink():
            target.symlink_to(os.readlink(src))
    elif src.is_dir():
        target.mkdir(parents=True, exist_ok=True)
    elif src.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def _is_elf(path: Path) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def shared_libraries(elfs: list[Path]) -> dict[str, Path]:
    """soname -> host file, for everything ``elfs`` load (ldd, transitively resolved)."""
    libs: dict[str, Path] = {}
    for elf in elfs:
        proc = subprocess.run(["ldd", str(elf)], capture_output=True, text=True)
        for line in proc.stdout.splitlines():
            parts = line.split()
            if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
                libs[parts[0]] = Path(parts[2])
            elif parts and parts[0].startswith("/") and parts[0].endswith(LOADER):
                libs[LOADER] = Path(parts[0])
            elif "not found" in line:
                raise PyBaseError(f"{elf}: {line.strip()}")
    return libs


def _find_lib(soname: str) -> Path:
    for d in (MULTIARCH, Path("/lib/x86_64-linux-gnu")):
        if (d / soname).exists():
            return d / soname
    raise PyBaseError(f"{soname} not found in {MULTIARCH}")


def install_libraries(root: Path, elfs: list[Path]) -> list[str]:
    """Copy what ``elfs`` link against into ``root``'s multiarch dir; returns sonames."""
    libs = shared_libraries(elfs)
    for name in EXTRA_LIBS:
        libs.setdefault(name, _find_lib(name))
    dest = root / MULTIARCH.relative_to("/")
    dest.mkdir(parents=True, exist_ok=True)
    for soname, path in sorted(libs.items()):
        if not (dest / soname).exists():
            shutil.copy2(path.resolve(), dest / soname)
    return sorted(libs)


def _filesystem(root: Path, arch: Arch | None = None) -> None:
    """Merged-/usr links, the loader at its ABI path, users, /tmp, CA certificates."""
    arch = arch or platforms.AMD64
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        (root / link).symlink_to(target)
    (root / "usr/lib64").mkdir(parents=True, exist_ok=True)
    # /lib64/ld-linux-x86-64.so.2 or /lib/ld-linux-aarch64.so.1, through the
    # merged-/usr link, to the file in the multiarch dir.
    loader_dir = root / "usr" / arch.loader_dir
    rel = "" if arch.loader_dir == "lib" else "../lib/"
    (loader_dir / arch.loader).symlink_to(f"{rel}{arch.triplet}/{arch.loader}")
    (root / "usr/bin/python3").symlink_to(PYTHON)
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    # 65532 is distroless' "nonroot": the manifests run every container as it.
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/sbin/nologin\n"
        "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
    )
    (etc / "group").write_text("root:x:0:\nnonroot:x:65532:\n")
    for d in ("tmp", "root", "home/nonroot"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)
    os.chown(root / "home/nonroot", 65532, 65532) if os.geteuid() == 0 else None
    certs = Path("/etc/ssl/certs/ca-certificates.crt")
    if not certs.exists():
        raise PyBaseError(f"{certs} missing: apt-get install ca-certificates")
    (etc / "ssl/certs").mkdir(parents=True)
    shutil.copy2(certs, etc / "ssl/certs/ca-certificates.crt")
    # Where Debian's OpenSSL (and so Python's ssl) looks by default.
    ssl_dir = root / "usr/lib/ssl"
    ssl_dir.mkdir(parents=True)
    (ssl_dir / "cert.pem").symlink_to("/etc/ssl/certs/ca-certificates.crt")
    (ssl_dir / "certs").symlink_to("/etc/ssl/certs")


def compile_bytecode(root: Path, tree: Path) -> None:
    """Unchecked-hash .pyc for every .py under ``root/tree`` (see the module docstring)."""
    _run(
        [
            str(INTERPRETER),
            "-I",
            "-m",
            "compileall",
            "-q",
            "-j0",
            "--invalidation-mode=unchecked-hash",
            "-s",
            str(root),
            "-p",
            "/",
            str(root / tree.relative_to("/")),
        ]
    )


def foreign_packages() -> tuple[str, ...]:
    """Debian's packages the layer is made of on another architecture (the CA
    bundle is architecture-independent: the host's is copied)."""
    return tuple(p for p in (*PACKAGES, *LIB_PACKAGES) if p != "ca-certificates")


def _sysroot(arch: Arch, cache_dir: Path) -> Path:
    try:
        return debs.Debian(cache_dir, arch.name).sysroot(foreign_packages())
    except debs.DebError as e:
        raise PyBaseError(f"Debian's {arch} packages: {e}") from e


def _fill_foreign(root: Path, arch: Arch, sysroot: Path) -> None:
    """The layer for ``arch`` from its packages' files in ``sysroot``."""
    src_stdlib = sysroot / STDLIB.relative_to("/")
    interpreter = sysroot / INTERPRETER.relative_to("/")
    files = [interpreter]
    for p in sorted(src_stdlib.rglob("*")):
        if not _pruned(STDLIB / p.relative_to(src_stdlib)):
            files.append(p)
    for f in files:
        _copy_into(root, f, Path("/") / f.relative_to(sysroot))
    elfs = [f for f in files if _is_elf(f)]
    libdirs = [sysroot / d / arch.triplet for d in ("usr/lib", "lib")]
    try:
        libs = debs.library_closure(elfs, libdirs, extra=[*EXTRA_LIBS, arch.loader])
    except debs.DebError as e:
        raise PyBaseError(f"{arch} libraries: {e}") from e
    dest = root / "usr/lib" / arch.triplet
    dest.mkdir(parents=True, exist_ok=True)
    for soname, path in sorted(libs.items()):
        if not (dest / soname).exists():
            shutil.copy2(path.resolve(), dest / soname)
    _filesystem(root, arch)
    compile_bytecode(root, STDLIB)


def layer(
    arch: Arch | None = None, cache_dir: Path | None = None
) -> tuple[str, Callable[[Path], None]]:
    """(cache key, fill) of the layer for ``arch`` (default: this machine's)."""
    arch = arch or platforms.host()
    if platforms.is_host(arch):
        return layer_key(), fill
    from sandman.harness.cluster.config import default_cache_dir

    sysroot = _sysroot(arch, cache_dir or default_cache_dir())
    h = hashlib.sha256(f"revision={REVISION}\narch={arch}\n{sysroot.name}\n".encode())
    key = f"pybase-{PYTHON}-{arch}-{h.hexdigest()[:16]}"
    return key, lambda root: _fill_foreign(root, arch, sysroot)


def fill(root: Path) -> None:
    """The layer's contents (ImageBuilder calls this with an empty dir)."""
    if not INTERPRETER.exists():
        raise PyBaseError(f"{INTERPRETER} missing: apt-get install {PYTHON}")
    files = _package_files()
    for f in files:
        _copy_into(root, f)
    elfs = [f for f in files if _is_elf(f)]
    install_libraries(root, elfs)
    _filesystem(root)
    compile_bytecode(root, STDLIB)
