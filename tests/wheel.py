"""Sandman as a platform team has it: a wheel built from this tree, installed
into a venv outside the checkout, run with nothing of the test's environment.

Shared by the wheel tests (tests/integration/test_wheel_install.py: build,
push, export, dry run; tests/e2e/test_wheel_cluster.py: an install on the
local cluster that sandboxes then use).
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from sandman.harness.cluster.config import default_cache_dir

REPO = Path(__file__).resolve().parents[1]
# The user's Python: Debian's python3.11, which the image builds copy from.
PYTHON = Path("/usr/bin/python3.11")
VENVS = default_cache_dir() / "wheel-venvs"
STALE_S = 86400.0

Run = Callable[..., "subprocess.CompletedProcess[str]"]


def wheel_key(wheel: Path) -> str:
    """A hash of the wheel's members (names and bytes), not of the zip: its
    timestamps change with every build of the same tree."""
    h = hashlib.sha256()
    with zipfile.ZipFile(wheel) as z:
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            h.update(info.filename.encode() + b"\0" + z.read(info) + b"\0")
    return h.hexdigest()[:16]


def wheel_venv(dist: Path) -> Path:
    """Build the wheel into ``dist`` and return a venv with it installed;
    cached by the wheel's contents (reruns of the same tree skip pip)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
        check=True, capture_output=True, timeout=300, cwd=dist,
    )  # fmt: skip
    (wheel,) = dist.glob("sandman_k8s-*.whl")
    venv = VENVS / wheel_key(wheel)
    VENVS.mkdir(parents=True, exist_ok=True)
    with open(VENVS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building it
        if not (venv / ".complete").exists():
            # Venvs of older trees, unless one may still be in use (a day).
            for old in VENVS.iterdir():
                if old.is_dir() and time.time() - old.stat().st_mtime > STALE_S:
                    shutil.rmtree(old, ignore_errors=True)
            subprocess.run([str(PYTHON), "-m", "venv", str(venv)], check=True)
            subprocess.run(
                [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                 str(wheel)],
                check=True, timeout=900, cwd=dist,
            )  # fmt: skip
            (venv / ".complete").write_text("")
    return venv


def user_env(
    venv: Path, home: Path, cache: Path, path: str | None = None, **extra: str
) -> dict[str, str]:
    """Nothing of the test's own environment: no PYTHONPATH, no VIRTUAL_ENV of
    the checkout's venv, no docker credentials of this machine."""
    go = shutil.which("go")  # the user's Go, for the images built from Go modules
    tools = f"{Path(go).parent}:" if go else ""
    return {
        "PATH": path or f"{venv / 'bin'}:{tools}/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "SANDMAN_CACHE_DIR": str(cache),
        "LANG": "C.UTF-8",
        **extra,
    }


def runner(venv: Path, workdir: Path, home: Path, cache: Path, **extra: str) -> Run:
    """Run the venv's `sandman` from ``workdir`` (outside the checkout)."""

    def run(
        *args: str, stdin: str = "", path: str | None = None, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(venv / "bin" / "sandman"), *args],
            input=stdin, capture_output=True, text=True, timeout=timeout, cwd=workdir,
            env=user_env(venv, home, cache, path, **extra),
        )  # fmt: skip

    return run


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    """The command's stdout; fails the test, showing both streams, unless it
    exited 0 without a traceback."""
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc.stdout
