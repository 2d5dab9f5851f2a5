"""The `sandman-controller` image: the webhook, reaper and extender on a minimal Python base.

Three layers, from the slowest-changing up, so that an upgrade pulls only
what changed (usually the last, under 1 MB):

1. ``pybase``: Debian's python3.11 and its libraries (``pybase.py``).
2. deps: the runtime dependencies of ``sandman-k8s[server]``, exactly the
   wheels pinned with hashes in ``controller-requirements.txt`` (pip,
   ``--require-hashes``, manylinux wheels for CPython 3.11), with bytecode.
3. app: the ``sandman`` package as ``pip install`` lays it out (the
   ``package-dir`` mapping of pyproject.toml: ``webhook/`` becomes
   ``sandman/webhook``, ...), with bytecode, and ``/usr/local/bin/sandman``.

For arm64 the same three layers: pybase from Debian's arm64 packages, the
same pins' aarch64 wheels (the lock holds each architecture's hash), the same
app files; the import check runs the image's own arm64 interpreter under
Debian's qemu-user-static.

Why not freeze it like the daemon: docs/install.md ("Controller image").
Refresh the pins with ``python -m sandman.harness.images.controller lock``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import sandman
from sandman.harness.images import debs, platforms, pybase
from sandman.harness.images.oci import ImageConfig
from sandman.harness.images.platforms import Arch

REPO_ROOT = Path(__file__).resolve().parents[2]
# In a checkout; an install from a wheel has no pyproject.toml, and its
# sandman/ dir already is the layout the image wants (package_dirs).
PYPROJECT = REPO_ROOT / "pyproject.toml"
LOCK = Path(__file__).resolve().parent / "controller-requirements.txt"
# Packages of the repo that the controller never imports: the harness and
# benchmarks need [dev], the daemon is frozen into its own image.
EXCLUDED_PACKAGES = ("sandman.harness", "sandman.bench", "sandman.daemon")
# Core dependencies of sandman-k8s that the controller never imports: the
# official client is there for the SDK's and CLI's kubeconfig loader, and it
# and what only it needs (pydantic, requests, ...) would be 70% of the image
# (126 MB installed of 175). The build's import check (``check_imports``)
# fails if a component starts importing it.
NOT_IN_IMAGE = frozenset({"kubernetes"})
# Modules every controller subcommand imports at start; the build checks that
# the image's own Python finds all of them with only the image's packages.
ENTRY_MODULES = (
    "sandman.cli.main",
    "sandman.webhook.cli",
    "sandman.webhook.server",
    "sandman.reaper.cli",
    "sandman.reaper.server",
    "sandman.extender.cli",
    "sandman.extender.server",
)
# The wheels pip may pick: CPython 3.11 on glibc, for the image's machine
# (x86_64, aarch64). Debian 12's glibc is 2.36, so any manylinux tag up to
# 2_36 runs (aarch64 wheels start at manylinux2014: the older tags match none).
MANYLINUX_TAGS = (
    "manylinux_2_36",
    "manylinux_2_34",
    "manylinux_2_28",
    "manylinux_2_17",
    "manylinux2014",
    "manylinux_2_5",
    "manylinux1",
)


def wheel_platforms(arch: Arch | None = None) -> tuple[str, ...]:
    machine = (arch or platforms.AMD64).machine
    return tuple(f"{tag}_{machine}" for tag in MANYLINUX_TAGS)


WHEEL_PLATFORMS = wheel_platforms()
# The architectures the lock holds wheel hashes for.
LOCK_ARCHES = (platforms.AMD64, platforms.ARM64)
TARGET_ENV = {"python_version": "3.11", "python_full_version": "3.11.2", "sys_platform": "linux"}
# Revisions of the two layer recipes (bump when the steps change).
DEPS_REVISION = 1
APP_REVISION = 1

SANDMAN_SCRIPT = f"""#!{pybase.INTERPRETER}
import sys

from sandman.cli.main import main

sys.exit(main())
"""

CONFIG = ImageConfig(
    cmd=("sandman", "--help"),
    env=(
        "PATH=/usr/local/bin:/usr/bin",
        # UTF-8 regardless of locale (the image has no locale data).
        "PYTHONUTF8=1",
        "PYTHONUNBUFFERED=1",
        # The root filesystem is read-only in the manifests; bytecode is built in.
        "PYTHONDONTWRITEBYTECODE=1",
    ),
    user="65532:65532",
    working_dir="/",
    labels={"org.opencontainers.image.title": "sandman-controller"},
)


class ControllerBuildError(RuntimeError):
    pass


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]


def _platform_args(arch: Arch | None = None) -> list[str]:
    args = ["--only-binary=:all:", "--python-version=3.11", "--implementation=cp"]
    for abi in ("cp311", "abi3", "none"):
        args.append(f"--abi={abi}")
    for plat in wheel_platforms(arch):
        args.append(f"--platform={plat}")
    return args


# -- layer 2: dependencies -------------------------------------------------------
def deps_key(arch: Arch | None = None) -> str:
    h = hashlib.sha256(f"revision={DEPS_REVISION}\n{pybase.PYTHON}\n".encode())
    if arch is not None and arch != platforms.AMD64:
        h.update(f"arch={arch}\n".encode())
    h.update(LOCK.read_bytes())
    return f"controller-deps-{h.hexdigest()[:16]}"


def fill_deps(root: Path, arch: Arch | None = None) -> None:
    target = root / pybase.SITE_PACKAGES.relative_to("/")
    proc = subprocess.run(
        _pip(
            "install",
            "--no-deps",
            "--require-hashes",
            "--no-compile",
            "--no-cache-dir",
            *_platform_args(arch),
            f"--target={target}",
            "-r",
            str(LOCK),
        ),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise ControllerBuildError(f"pip install of {LOCK.name} failed:\n{proc.stderr[-3000:]}")
    # Console scripts carry the build venv's shebang; the image has its own.
    shutil.rmtree(target / "bin", ignore_errors=True)
    pybase.compile_bytecode(root, pybase.SITE_PACKAGES)


# -- layer 3: the sandman package -------------------------------------------------
def _excluded(pkg: str) -> bool:
    return any(pkg == x or pkg.startswith(x + ".") for x in EXCLUDED_PACKAGES)


def installed_package_dirs(root: Path) -> dict[str, Path]:
    """Import name -> dir for every package under ``root`` (the installed
    ``sandman/``: what a wheel laid out)."""
    out = {}
    for init in sorted(root.rglob("__init__.py")):
        rel = init.parent.relative_to(root.parent)
        pkg = ".".join(rel.parts)
        if "__pycache__" not in rel.parts and not _excluded(pkg):
            out[pkg] = init.parent
    return out


def package_dirs() -> dict[str, Path]:
    """Import name -> source dir, from pyproject.toml (what `pip install` would copy)."""
    if not PYPROJECT.exists():
        return installed_package_dirs(Path(sandman.__file__).resolve().parent)
    cfg = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]
    mapping = cfg["package-dir"]
    out: dict[str, Path] = {}
    for pkg in cfg["packages"]:
        if _excluded(pkg):
            continue
        # The longest mapped prefix decides (sandman.webhook -> webhook/).
        base = max((k for k in mapping if pkg == k or pkg.startswith(k + ".")), key=len)
        rest = pkg[len(base) :].lstrip(".").split(".") if pkg != base else []
        out[pkg] = REPO_ROOT / mapping[base] / Path(*rest) if rest else REPO_ROOT / mapping[base]
    return out


def app_files() -> list[tuple[str, Path]]:
    """(path inside site-packages, source file) for every module of the package."""
    files = []
    for pkg, src in sorted(package_dirs().items()):
        for f in sorted(src.glob("*.py")):
            files.append((f"{pkg.replace('.', '/')}/{f.name}", f))
    return files


def app_key() -> str:
    h = hashlib.sha256(f"revision={APP_REVISION}\n".encode())
    h.update(SANDMAN_SCRIPT.encode())
    for rel, src in app_files():
        for chunk in (rel.encode(), src.read_bytes()):
            h.update(len(chunk).to_bytes(8, "big"))
            h.update(chunk)
    return f"controller-app-{h.hexdigest()[:16]}"


def fill_app(root: Path) -> None:
    site = root / pybase.SITE_PACKAGES.relative_to("/")
    for rel, src in app_files():
        dest = site / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    script = root / "usr/local/bin/sandman"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(SANDMAN_SCRIPT)
    script.chmod(0o755)
    pybase.compile_bytecode(root, pybase.SITE_PACKAGES)


def check_imports(rootfs: Path, arch: Arch | None = None) -> None:
    """Import every entry module with the image's own Python and packages only.

    As root the check runs the image's interpreter in a chroot, so a missing
    shared library fails it too; otherwise the host's identical python3.11
    runs with ``sys.path`` pointing into the unpacked image. An image of
    another architecture runs its own interpreter under qemu-user with the
    unpacked image as its root for file lookups (``-L``): its loader, its
    libraries, its extension modules.
    """
    imports = "".join(f"importlib.import_module({m!r})\n" for m in ENTRY_MODULES)
    code = "import importlib\n" + imports
    if arch is not None and not platforms.is_host(arch):
        paths = [pybase.STDLIB, pybase.STDLIB / "lib-dynload", pybase.SITE_PACKAGES]
        code = f"import sys\nsys.path[:] = {[str(p) for p in paths]!r}\n" + code
        try:
            qemu = debs.qemu_user(_cache_dir(), arch)
        except debs.DebError as e:
            raise ControllerBuildError(f"qemu-user for {arch}: {e}") from e
        interpreter = rootfs / pybase.INTERPRETER.relative_to("/")
        argv = [str(qemu), "-L", str(rootfs), str(interpreter), "-I", "-S", "-c", code]
    elif os.geteuid() == 0:
        argv = [
            shutil.which("chroot") or "/usr/sbin/chroot",
            str(rootfs),
            str(pybase.INTERPRETER),
            "-I",
            "-c",
            code,
        ]
    else:
        paths = [pybase.STDLIB, pybase.STDLIB / "lib-dynload", pybase.SITE_PACKAGES]
        inside = [str(rootfs / p.relative_to("/")) for p in paths]
        code = f"import sys\nsys.path[:] = {inside!r}\n" + code
        argv = [str(pybase.INTERPRETER), "-I", "-S", "-c", code]
    proc = subprocess.run(argv, capture_output=True, text=True, env={"PYTHONUTF8": "1"})
    if proc.returncode != 0:
        raise ControllerBuildError(
            "the controller image cannot import its entry modules (a dependency missing "
            f"from {LOCK.name}, or a component importing one of {sorted(NOT_IN_IMAGE)}?):\n"
            + proc.stderr[-3000:]
        )


def _cache_dir() -> Path:
    from sandman.harness.cluster.config import default_cache_dir

    return default_cache_dir()


def image_check(arch: Arch | None = None) -> Callable[[Path], None]:
    """The build's check of an unpacked controller image of ``arch``."""
    return lambda rootfs: check_imports(rootfs, arch)


def layers(arch: Arch | None = None) -> tuple[tuple[str, object], ...]:
    """(cache key, fill) per layer for ``arch`` (default: this machine's); the
    app layer is the same files for every architecture."""
    arch = arch or platforms.host()
    base = pybase.layer(arch, _cache_dir())
    if arch == platforms.AMD64:
        deps: tuple[str, object] = (deps_key(), fill_deps)
    else:
        deps = (deps_key(arch), lambda root: fill_deps(root, arch))
    return (base, deps, (app_key(), fill_app))


# -- the lock file ---------------------------------------------------------------
def _closure(roots: list[str], skip: frozenset[str] = frozenset()) -> dict[str, str]:
    """name -> installed version for ``roots`` and everything they require here
    (except ``skip`` and what only they need)."""
    # `lock` is a maintainer's command ([dev] has packaging); building the
    # image must not need it.
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    env = {**default_environment(), **TARGET_ENV}
    seen: dict[str, str] = {}
    todo = [(r, "") for r in roots]
    while todo:
        spec, extra = todo.pop()
        req = Requirement(spec)
        if req.name.lower() in skip:
            continue
        if req.marker and not req.marker.evaluate({**env, "extra": extra}):
            continue
        dist = metadata.distribution(req.name)
        name = dist.metadata["Name"]
        key = name.lower().replace("_", "-")
        if key in seen and not req.extras:
            continue
        seen[key] = dist.version
        for sub in dist.requires or []:
            for ex in ["", *sorted(req.extras)]:
                todo.append((sub, ex))
    return seen


def lock(out: Path = LOCK) -> None:
    """Pin ``sandman-k8s[server]``'s runtime closure at the versions installed in
    this venv (the ones the tests ran with), with the hashes of the wheels the
    image build will pick."""
    pins = _closure(["sandman-k8s[server]"], skip=NOT_IN_IMAGE)
    pins.pop("sandman-k8s", None)
    with tempfile.TemporaryDirectory(prefix="sandman-lock-") as tmp:
        reqs = Path(tmp) / "pins.txt"
        reqs.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
        hashes: dict[str, list[str]] = {name: [] for name in pins}
        for arch in LOCK_ARCHES:
            dest = Path(tmp) / arch.name
            proc = subprocess.run(
                _pip("download", "--no-deps", *_platform_args(arch), "-d", dest, "-r", reqs),
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise ControllerBuildError(f"pip download ({arch}) failed:\n{proc.stderr[-3000:]}")
            wheels = sorted(dest.glob("*.whl"))
            for name, version in sorted(pins.items()):
                norm = name.replace("-", "_").lower()
                match = [w for w in wheels if w.name.lower().startswith(f"{norm}-{version}-")]
                if len(match) != 1:
                    raise ControllerBuildError(
                        f"no single {arch} wheel for {name}=={version}: {match}"
                    )
                digest = hashlib.sha256(match[0].read_bytes()).hexdigest()
                if digest not in hashes[name]:  # a pure-Python wheel serves every arch
                    hashes[name].append(digest)
        lines = [
            "# The controller image's Python dependencies: the runtime closure of\n",
            "# sandman-k8s[server] without the official client (NOT_IN_IMAGE in\n",
            "# controller.py), at the versions the tests ran with, hashed: one\n",
            f"# wheel per architecture ({', '.join(a.name for a in LOCK_ARCHES)}).\n",
            "# Regenerate: python -m sandman.harness.images.controller lock\n",
        ]
        for name, version in sorted(pins.items()):
            flags = " ".join(f"--hash=sha256:{d}" for d in hashes[name])
            lines.append(f"{name}=={version} {flags}\n")
    out.write_text("".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="The controller image's dependency pins.")
    p.add_argument("command", choices=["lock"])
    p.parse_args(argv)
    lock()
    print(LOCK)
    return 0


if __name__ == "__main__":
    sys.exit(main())
