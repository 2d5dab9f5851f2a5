"""Build `sandmand`, the daemon as one static x86_64 executable (design section 3).

PyInstaller (onefile) freezes ``sandman.daemon`` into a bootloader plus an
archive; staticx then bundles that bootloader's dynamic loader and libraries
(glibc included) so the result runs in any image, with or without a libc.
How and why is in ``daemon/freeze/README.md``.

Everything lives under ``<cache>/daemon/``:

- ``venv-<key>/``: the build tools and the daemon's runtime deps, exactly as
  pinned in ``daemon/freeze/requirements-freeze.txt``; keyed by that file and
  the interpreter, so nothing else reinstalls it.
- ``sandmand-<key>/sandmand``: the executable, keyed by every file under
  ``daemon/`` (freeze recipe included), ``sandman/__init__.py`` (frozen in as
  the parent package), the pins and the interpreter; editing the daemon
  rebuilds it, editing any other component does not.
- ``build.log``: the last build's output.

Both are built under a temporary name and renamed into place, and a file lock
serialises concurrent builders (two test runs, or `make daemon` and a test).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from sandman.harness.cluster.config import default_cache_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
DAEMON_SRC = REPO_ROOT / "daemon"
FREEZE_DIR = DAEMON_SRC / "freeze"
REQUIREMENTS = FREEZE_DIR / "requirements-freeze.txt"
SPEC = FREEZE_DIR / "sandmand.spec"
PARENT_INIT = REPO_ROOT / "sandman" / "__init__.py"
# The pod contract (names shared with the webhook): standard library only, so
# the daemon is frozen with it rather than keeping a copy of its names.
CONTRACT = REPO_ROOT / "sandman" / "contract.py"

# Debian's interpreter: its libpython and extensions have no RUNPATH. pyenv's
# do, and staticx rejects such a PyInstaller archive ("Unsupported
# PyInstaller input"; see daemon/freeze/README.md).
BUILD_PYTHON = Path("/usr/bin/python3")

# Bump when the build steps in this module change, so cached executables made
# the old way are rebuilt (the recipe's inputs are hashed; this code is not).
BUILD_REVISION = 2

# staticx's own archive is xz-compressed by default; unpacking it cost ~0.35 s
# of every start (`sandmand version` in a busybox rootfs: 0.66 s compressed,
# 0.28 s not) to save 2.3 MB (14.4 vs 12.0 MB), as the PyInstaller archive
# inside is zlib-compressed already. Start-up is what a sandbox waits for.
# --strip strips the system libraries staticx adds.
STATICX_ARGS = ("--strip", "--no-compress")

# Builds tried while the daemon's sources change under us (files saved
# mid-build). A build takes ~20 s, so a third collision in a row means someone
# is editing continuously: better to say so than to loop.
BUILD_ATTEMPTS = 3

# Hex digits of SHA-256 in cache names: 64 bits, ample for a handful of entries.
KEY_CHARS = 16

# Characters of build log quoted in an error; as sandman.harness.cluster.binaries does.
LOG_TAIL_CHARS = 3000

# Environment a build must not inherit: the caller's venv or PYTHONPATH would
# put the whole repo (Kubernetes client and all) in reach of PyInstaller.
_SCRUBBED_ENV_PREFIXES = ("PYTHON", "VIRTUAL_ENV")

Progress = Callable[[str], None]


class DaemonBuildError(RuntimeError):
    pass


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- cache keys --------------------------------------------------------------
def daemon_files() -> list[Path]:
    """Every source file of the daemon and its freeze recipe (no bytecode)."""
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


def venv_key(interpreter: str) -> str:
    return _digest([("interpreter", interpreter.encode()), ("pins", REQUIREMENTS.read_bytes())])


def binary_key(interpreter: str) -> str:
    parts = [
        ("revision", str(BUILD_REVISION).encode()),
        ("interpreter", interpreter.encode()),
        ("pins", REQUIREMENTS.read_bytes()),
        ("sandman/__init__.py", PARENT_INIT.read_bytes()),
        ("sandman/contract.py", CONTRACT.read_bytes()),
    ]
    parts += [(str(p.relative_to(REPO_ROOT)), p.read_bytes()) for p in daemon_files()]
    return _digest(parts)


def _interpreter_version() -> str:
    if not os.access(BUILD_PYTHON, os.X_OK):
        raise DaemonBuildError(f"{BUILD_PYTHON} not found: apt-get install python3 python3-venv")
    # sys.version carries the build date too, so a Debian update of the same
    # 3.11.x still counts as a new interpreter.
    out = subprocess.run(
        [str(BUILD_PYTHON), "-I", "-c", "import sys; print(sys.version)"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise DaemonBuildError(f"{BUILD_PYTHON} does not run:\n{out.stderr}")
    return out.stdout.strip()


def daemon_version() -> str:
    """``sandman.daemon.__version__``, read from source (the build checks it)."""
    tree = ast.parse((DAEMON_SRC / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            return str(ast.literal_eval(node.value))
    raise DaemonBuildError(f"no __version__ in {DAEMON_SRC / '__init__.py'}")


# -- building ----------------------------------------------------------------
@contextlib.contextmanager
def _locked(path: Path, progress: Progress) -> Iterator[None]:
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another sandmand build to finish ({path})")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _build_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_ENV_PREFIXES)}
    env.update(extra)
    return env


def _run(
    what: str,
    cmd: Sequence[str | Path],
    log: Path,
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
) -> None:
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(map(str, cmd))}\n")
        f.flush()
        rc = subprocess.run(
            [str(c) for c in cmd],
            cwd=cwd,
            env=dict(env) if env is not None else _build_env({}),
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
        ).returncode
    if rc != 0:
        tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        raise DaemonBuildError(f"{what} failed (exit {rc}); end of {log}:\n{tail}")


def _ensure_venv(root: Path, interpreter: str, log: Path, progress: Progress) -> Path:
    venv = root / f"venv-{venv_key(interpreter)}"
    if (venv / "bin" / "python").exists():
        return venv
    tmp = venv.with_name(f"{venv.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    progress(f"creating the daemon build venv ({BUILD_PYTHON}, {REQUIREMENTS.name})")
    _run(
        f"{BUILD_PYTHON} -m venv (is python3-venv installed?)",
        [BUILD_PYTHON, "-m", "venv", tmp],
        log,
        cwd=root,
    )
    # A venv is not relocatable for its console scripts (absolute shebangs),
    # which is why every tool is run as `bin/python -m TOOL`: that works after
    # the rename below.
    py = tmp / "bin" / "python"
    pip = [py, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run("pip install", [*pip, "install", "--no-deps", "-r", REQUIREMENTS], log, cwd=root)
    # --no-deps installs exactly the pins; this catches a pin list that
    # misses a dependency instead of letting the executable fail at run time.
    _run("pip check (requirements-freeze.txt misses a dependency?)", [*pip, "check"], log, cwd=root)
    tmp.rename(venv)
    return venv


def _stage_sources(src: Path) -> None:
    """Copy in exactly what may be frozen: the parent package's __init__, the
    contract and the daemon."""
    pkg = src / "sandman"
    pkg.mkdir(parents=True)
    shutil.copyfile(PARENT_INIT, pkg / "__init__.py")
    shutil.copyfile(CONTRACT, pkg / "contract.py")
    shutil.copytree(
        DAEMON_SRC,
        pkg / "daemon",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", FREEZE_DIR.name),
    )


def _check_no_foreign_sandman_imports(warn_file: Path) -> None:
    # A daemon module importing another component (sandman.harness.kube, ...) would
    # only fail inside a sandbox; PyInstaller lists it as a missing module.
    if not warn_file.exists():
        return
    bad = [
        line.strip()
        for line in warn_file.read_text().splitlines()
        if line.startswith("missing module named sandman")
    ]
    if bad:
        raise DaemonBuildError(
            "the daemon imports sandman modules outside sandman.daemon, which are not "
            "frozen in:\n" + "\n".join(bad)
        )


def _freeze(venv: Path, out: Path, work: Path, log: Path, progress: Progress) -> None:
    py = venv / "bin" / "python"
    src = work / "src"
    _stage_sources(src)
    env = _build_env(
        {
            "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            # The spec reads SANDMAN_FREEZE_SRC; PYTHONPATH makes the staged
            # package importable for collect_submodules, which runs in a child.
            "SANDMAN_FREEZE_SRC": str(src),
            "PYTHONPATH": str(src),
        }
    )
    progress("freezing sandman.daemon with PyInstaller (onefile)")
    dirs = ["--distpath", work / "dist", "--workpath", work / "build"]
    _run(
        "PyInstaller",
        [py, "-m", "PyInstaller", "--noconfirm", *dirs, SPEC],
        log,
        cwd=work,  # not the repo: `python -m` puts the cwd on sys.path
        env=env,
    )
    _check_no_foreign_sandman_imports(work / "build" / "sandmand" / "warn-sandmand.txt")
    progress("making it static with staticx")
    _run(
        "staticx",
        [py, "-m", "staticx", *STATICX_ARGS, work / "dist" / "sandmand", out],
        log,
        cwd=work,
        env=env,
    )
    out.chmod(0o755)
    # A binary that cannot even print its version must not reach the cache.
    smoke = subprocess.run(
        [str(out), "version"],
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(work)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    want = daemon_version()
    if smoke.returncode != 0 or smoke.stdout.strip() != want:
        raise DaemonBuildError(
            f"the built {out.name} does not run: `version` exited {smoke.returncode}, "
            f"printed {smoke.stdout.strip()!r} (want {want!r}); stderr:\n{smoke.stderr[-2000:]}"
        )


def _prune(root: Path, keep: set[str]) -> None:
    # Old keys (an earlier daemon or pin set) and leftovers of killed builds;
    # called under the lock, so no other builder is using any of them.
    for entry in root.iterdir():
        if entry.name in keep or not entry.name.startswith(("venv-", "sandmand-", "work-")):
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def current_key() -> str:
    """The cache key the executable of the current sources has (no build)."""
    return binary_key(_interpreter_version())


def _cached_exe(root: Path, interpreter: str) -> Path:
    return root / f"sandmand-{binary_key(interpreter)}" / "sandmand"


def _build_once(root: Path, interpreter: str, exe: Path, progress: Progress) -> bool:
    """Build ``exe``; False (nothing cached) if the sources changed meanwhile."""
    log = root / "build.log"
    log.write_text(f"# sandmand build {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
    started = time.monotonic()
    venv = _ensure_venv(root, interpreter, log, progress)
    final = exe.parent
    work = Path(tempfile.mkdtemp(prefix="work-", dir=root))
    try:
        tmp_final = work / final.name
        tmp_final.mkdir()
        _freeze(venv, tmp_final / exe.name, work, log, progress)
        # The key was taken before staging: an edit in between would cache
        # new code under the old sources' key.
        if _cached_exe(root, interpreter) != exe:
            return False
        tmp_final.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune(root, keep={venv.name, final.name})
    size = exe.stat().st_size / 1e6
    progress(f"built {exe} ({size:.1f} MB) in {time.monotonic() - started:.0f}s")
    return True


def ensure_daemon_binary(cache_dir: Path, progress: Progress = _stderr) -> Path:
    """The static `sandmand` executable for the current daemon source, built if needed."""
    root = cache_dir / "daemon"
    root.mkdir(parents=True, exist_ok=True)
    interpreter = _interpreter_version()
    exe = _cached_exe(root, interpreter)
    if exe.exists():
        return exe
    with _locked(root / ".lock", progress):
        for _ in range(BUILD_ATTEMPTS):
            exe = _cached_exe(root, interpreter)
            if exe.exists():
                return exe  # another builder made it while we waited
            if _build_once(root, interpreter, exe, progress):
                return exe
            progress("the daemon's sources changed during the build; building again")
    raise DaemonBuildError(
        f"the daemon's sources changed during each of {BUILD_ATTEMPTS} builds; try again"
    )


# -- command line (`make daemon`) --------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Build the static sandmand executable (cached).")
    p.add_argument("--out", type=Path, help="also copy the executable here")
    p.add_argument("--cache-dir", type=Path, default=None, help="default: ~/.cache/sandman")
    args = p.parse_args(argv)
    try:
        exe = ensure_daemon_binary(args.cache_dir or default_cache_dir())
    except DaemonBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_name(f".{args.out.name}.tmp")
        shutil.copyfile(exe, tmp)
        tmp.chmod(0o755)
        tmp.replace(args.out)
        exe = args.out
    print(exe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
