"""How each of our images' root filesystems is made.

A recipe fills one directory per layer. Its ``key`` names everything the
result depends on (inputs and recipe revision): layers are cached under that
key, so a warm build only re-assembles the manifest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sandman.harness.images.oci import ImageConfig

HERE = Path(__file__).resolve().parent
BUSYBOX = Path("/bin/busybox")  # from Debian's busybox-static: no shared libc needed

# Debian release and mirror for the `swe` image: the same suite as the host,
# from the only package mirror this machine reaches.
SWE_SUITE = "bookworm"
SWE_MIRROR = "http://deb.debian.org/debian"
SWE_PACKAGES = ("git", "python3", "ca-certificates")

LayerFn = Callable[[Path], None]


@dataclass(frozen=True)
class Recipe:
    name: str
    tag: str
    layers: tuple[tuple[str, LayerFn], ...]  # (cache key, fill function)
    config: ImageConfig
    needs: tuple[str, ...] = field(default=())  # host commands the recipe runs
    # Component images are `sandman-<name>` under the registry (prefix);
    # the test images live under `sandman/`.
    repository: str | None = None
    # Checks the assembled image, unpacked into a dir (once per manifest digest).
    verify: Callable[[Path], None] | None = None

    @property
    def repo(self) -> str:
        return self.repository or f"sandman/{self.name}"


def _run(*argv: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    subprocess.run(argv, cwd=cwd, env=env, check=True, capture_output=True)


# -- pause --------------------------------------------------------------------
def _pause_layer(root: Path) -> None:
    _run("gcc", "-Os", "-static", "-s", "-o", str(root / "pause"), str(HERE / "pause.c"))


# -- tiny ---------------------------------------------------------------------
TINY_INDEX = "sandman tiny image: busybox only, no libc, no python\n"


def _tiny_layer(root: Path) -> None:
    if not BUSYBOX.exists():
        raise FileNotFoundError(f"{BUSYBOX} missing: apt-get install busybox-static")
    (root / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    applets = subprocess.run(
        [str(BUSYBOX), "--list-full"], check=True, capture_output=True, text=True
    ).stdout.split()
    for applet in applets:
        link = root / applet
        if link.exists() or link.is_symlink():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath("/bin/busybox", "/" + str(Path(applet).parent)))
    _base_files(root)
    (root / "www").mkdir()
    (root / "www" / "index.html").write_text(TINY_INDEX)


def _base_files(root: Path) -> None:
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
    )
    (etc / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    for d in ("root", "tmp", "dev", "proc", "sys", "run"):
        (root / d).mkdir(exist_ok=True)
    os.chmod(root / "tmp", 0o1777)


# -- swe ----------------------------------------------------------------------
def _swe_base_layer(root: Path) -> None:
    _run(
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(SWE_PACKAGES)}",
        SWE_SUITE,
        str(root),
        SWE_MIRROR,
    )
    # Package caches and logs are build leftovers, not part of the task image.
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log"):
        for child in (root / junk).glob("*"):
            if child.is_file():
                child.unlink()


# A stand-in for a SWE-bench task: a tiny library with a one-line bug and a
# test that fails until the bug is fixed.
SWE_REPO_FILES = {
    "calc/__init__.py": "",
    "calc/ops.py": textwrap.dedent(
        '''\
        """Arithmetic helpers."""


        def add(a, b):
            return a + b


        def mean(values):
            """Arithmetic mean of a non-empty sequence."""
            return sum(values) / (len(values) + 1)
        '''
    ),
    "tests/__init__.py": "",
    "tests/test_ops.py": textwrap.dedent(
        """\
        import unittest

        from calc.ops import add, mean


        class OpsTest(unittest.TestCase):
            def test_add(self):
                self.assertEqual(add(2, 3), 5)

            def test_mean(self):
                self.assertEqual(mean([1, 2, 3, 4]), 2.5)


        if __name__ == "__main__":
            unittest.main()
        """
    ),
    "README.md": "Run `python3 -m unittest` to see the failing test.\n",
}
SWE_REPO_DIR = "work/repo"
SWE_BUGGY_LINE = "    return sum(values) / (len(values) + 1)\n"
SWE_FIXED_LINE = "    return sum(values) / len(values)\n"


def _swe_repo_layer(root: Path) -> None:
    repo = root / SWE_REPO_DIR
    for rel, text in SWE_REPO_FILES.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root),
        "GIT_AUTHOR_NAME": "sandman",
        "GIT_AUTHOR_EMAIL": "tasks@sandman.dev",
        "GIT_COMMITTER_NAME": "sandman",
        "GIT_COMMITTER_EMAIL": "tasks@sandman.dev",
        "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
    }
    _run("git", "init", "-q", "-b", "main", str(repo), env=env)
    _run("git", "add", "-A", cwd=repo, env=env)
    _run("git", "commit", "-q", "-m", "calc: initial import", cwd=repo, env=env)


# -- entry: tiny plus an ENTRYPOINT script and a CMD (pods without a command
# run the image's own ENTRYPOINT/CMD under the daemon) --------------------------
ENTRY_SCRIPT = '#!/bin/sh\necho "entrypoint ran in $(pwd) with: $*"\nexec "$@"\n'


def _entry_layer(root: Path) -> None:
    (root / "entry.sh").write_text(ENTRY_SCRIPT)
    os.chmod(root / "entry.sh", 0o755)


PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

RECIPES: dict[str, Recipe] = {
    "pause": Recipe(
        name="pause",
        tag="3.10",
        layers=(("pause-r1", _pause_layer),),
        config=ImageConfig(entrypoint=("/pause",), user="65535:65535", env=(PATH_ENV,)),
        needs=("gcc",),
    ),
    "tiny": Recipe(
        name="tiny",
        tag="1",
        layers=(("tiny-r1", _tiny_layer),),
        config=ImageConfig(
            cmd=("httpd", "-f", "-v", "-p", "8080", "-h", "/www"),
            env=(PATH_ENV,),
            working_dir="/",
            user="0:0",
            exposed_ports=("8080/tcp",),
        ),
    ),
    "entry": Recipe(
        name="entry",
        tag="1",
        layers=(("tiny-r1", _tiny_layer), ("entry-r1", _entry_layer)),
        config=ImageConfig(
            entrypoint=("/entry.sh",),
            # `$$` is the shell's pid: it survives only if the webhook escapes
            # it against the kubelet's $(VAR) expansion (which turns $$ into $).
            cmd=("sh", "-c", "echo cmd ran pid=$$; exec sleep 3600"),
            env=(PATH_ENV,),
            working_dir="/www",
            user="0:0",
        ),
    ),
    "swe": Recipe(
        name="swe",
        tag="1",
        layers=(
            (f"swe-base-{SWE_SUITE}-{'-'.join(SWE_PACKAGES)}-r1", _swe_base_layer),
            ("swe-repo-r1", _swe_repo_layer),
        ),
        config=ImageConfig(
            cmd=("sleep", "infinity"),
            env=(PATH_ENV, "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1"),
            working_dir=f"/{SWE_REPO_DIR}",
            user="0:0",
        ),
        needs=("debootstrap", "git"),
    ),
}
