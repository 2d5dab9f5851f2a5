"""/v1/reset: put a used sandbox back into the state it started in, and prove it.

A sandbox reused for another rollout must not leak the previous rollout's
edits, files or processes into the next reward. Reset restores what it can
(processes, the git workspace, temp dirs) and then verifies independently of
what it just did; anything it cannot verify is reported as drift, and the
client must replace such a sandbox instead of reusing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sandman.daemon.children import ChildReaper, descendants
from sandman.daemon.commands import run_command
from sandman.daemon.requests import ExecRequest

GIT_TIMEOUT_S = 120.0
# How long killed processes get to disappear before reset calls them drift.
KILL_SETTLE_S = 2.0


@dataclass(frozen=True)
class Pristine:
    """What "clean" means for this sandbox, recorded at first use."""

    workspace: str | None
    commit: str | None
    branch: str | None
    manifests: dict[str, str]  # path -> sha256 (or "missing")

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> Pristine | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None


def file_digest(path: Path) -> str:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except FileNotFoundError:
        return "missing"


class Git:
    """git through the daemon's own spawner (never subprocess.run: see children.py)."""

    def __init__(self, reaper: ChildReaper, env: Mapping[str, str], workspace: str) -> None:
        # A repo owned by another uid than ours is "dubious" to git >= 2.35.2.
        self.env = {
            **env,
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory",
            "GIT_CONFIG_VALUE_0": "*",
            "GIT_TERMINAL_PROMPT": "0",
        }
        self.reaper = reaper
        self.workspace = workspace

    async def __call__(self, *args: str) -> tuple[int, str, str]:
        req = ExecRequest(
            argv=("git", "-C", self.workspace, *args),
            cwd=None,
            env={},
            stdin=None,
            timeout_s=GIT_TIMEOUT_S,
            max_output_bytes=1 << 20,
        )
        try:
            res = await run_command(self.reaper, req, self.env)
        except Exception as e:
            return 127, "", str(e)
        return (
            res.exit_code,
            res.stdout.decode(errors="replace"),
            res.stderr.decode(errors="replace"),
        )


async def record(
    reaper: ChildReaper,
    env: Mapping[str, str],
    workspace: Path | None,
    manifests: tuple[Path, ...],
) -> Pristine:
    commit = branch = None
    if workspace is not None:
        git = Git(reaper, env, str(workspace))
        code, out, _ = await git("rev-parse", "--verify", "HEAD")
        if code == 0:
            commit = out.strip()
            code, out, _ = await git("symbolic-ref", "--quiet", "--short", "HEAD")
            branch = out.strip() if code == 0 else None
    return Pristine(
        workspace=str(workspace) if workspace else None,
        commit=commit,
        branch=branch,
        manifests={str(p): file_digest(p) for p in manifests},
    )


def _ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    out.add(1)
    return out


def owns_pid_namespace() -> bool:
    """True when PID 1 is the daemon's own chain (it is the sandbox's init).

    Then reset may kill every other process in the namespace, including ones
    started by `kubectl exec`, which are not our descendants. Anywhere else
    (a developer's host, the test suite) only our descendants are ours.
    """
    try:
        argv0 = Path("/proc/1/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return os.path.basename(argv0) == b"sandmand" or os.getpid() == 1


def foreign_processes() -> list[int]:
    """The processes reset kills: every live process of the sandbox except
    PID 1, the daemon and its ancestors (the frozen bootloaders)."""
    if owns_pid_namespace():
        keep = _ancestors()
        candidates = [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) not in keep]
    else:
        candidates = descendants(os.getpid())
    out = []
    for pid in candidates:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out


def clear_dir(d: Path, keep: tuple[Path, ...]) -> list[str]:
    """Remove a temp dir's contents (not the dir); returns what failed."""
    failed = []
    keep_real = {os.path.realpath(k) for k in keep}
    try:
        entries = list(os.scandir(d))
    except FileNotFoundError:
        return []
    for e in entries:
        real = os.path.realpath(e.path)
        if any(real == k or k.startswith(real + "/") for k in keep_real):
            continue
        try:
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path)
            else:
                os.unlink(e.path)
        except OSError as err:
            failed.append(f"{e.path}: {err.strerror}")
    return failed


@dataclass
class ResetReport:
    clean: bool
    drift: list[str]
    actions: list[str]
    duration_ms: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def reset(
    reaper: ChildReaper,
    env: Mapping[str, str],
    pristine: Pristine,
    temp_dirs: tuple[Path, ...],
    keep: tuple[Path, ...],
) -> ResetReport:
    t0 = time.monotonic()
    actions: list[str] = []
    drift: list[str] = []

    # 1. Processes: everything but PID 1 and the daemon's own chain.
    victims = foreign_processes()
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if victims:
        actions.append(f"killed {len(victims)} process(es)")
    deadline = time.monotonic() + KILL_SETTLE_S
    while foreign_processes() and time.monotonic() < deadline:
        reaper.reap()
        await asyncio.sleep(0.02)

    # 2. The git workspace, back to the commit recorded at first use.
    if pristine.workspace and pristine.commit:
        git = Git(reaper, env, pristine.workspace)
        steps: list[tuple[str, ...]] = []
        if pristine.branch:
            steps.append(("checkout", "--force", "-B", pristine.branch, pristine.commit))
        else:
            steps.append(("checkout", "--force", "--detach", pristine.commit))
        steps += [("reset", "--hard", pristine.commit), ("clean", "-ffdx"), ("stash", "clear")]
        for step in steps:
            code, _, err = await git(*step)
            if code != 0:
                drift.append(f"git {' '.join(step)} failed: {err.strip()[:300]}")
        actions.append(f"restored {pristine.workspace} to {pristine.commit[:12]}")

    # 3. Temp dirs.
    for d in temp_dirs:
        for failure in clear_dir(d, keep):
            drift.append(f"temp not cleared: {failure}")
    actions.append(f"cleared {', '.join(map(str, temp_dirs))}")

    # 4. Verify, independently of what the steps above reported.
    drift += await verify(reaper, env, pristine, temp_dirs, keep)
    return ResetReport(not drift, drift, actions, (time.monotonic() - t0) * 1000)


async def verify(
    reaper: ChildReaper,
    env: Mapping[str, str],
    pristine: Pristine,
    temp_dirs: tuple[Path, ...],
    keep: tuple[Path, ...],
) -> list[str]:
    drift: list[str] = []
    left = foreign_processes()
    if left:
        drift.append(f"{len(left)} process(es) survived: pids {left[:10]}")
    if pristine.workspace and pristine.commit:
        git = Git(reaper, env, pristine.workspace)
        code, out, err = await git("rev-parse", "--verify", "HEAD")
        if code != 0:
            drift.append(f"workspace HEAD unreadable: {err.strip()[:300]}")
        elif out.strip() != pristine.commit:
            drift.append(f"workspace HEAD is {out.strip()[:12]}, not {pristine.commit[:12]}")
        code, out, err = await git("status", "--porcelain", "--ignored", "--untracked-files=all")
        if code != 0:
            drift.append(f"git status failed: {err.strip()[:300]}")
        elif out.strip():
            lines = out.strip().splitlines()
            drift.append(f"workspace not clean: {len(lines)} change(s), e.g. {lines[:3]}")
    elif pristine.workspace:
        drift.append(f"workspace {pristine.workspace} had no git commit at first use")
    for path, digest in pristine.manifests.items():
        now = file_digest(Path(path))
        if now != digest:
            drift.append(f"dependency manifest {path} changed ({digest[:12]} -> {now[:12]})")
    keep_real = {os.path.realpath(k) for k in keep}
    for d in temp_dirs:
        with contextlib.suppress(FileNotFoundError):
            extra = [
                e.path
                for e in os.scandir(d)
                if not any(
                    k == os.path.realpath(e.path) or k.startswith(os.path.realpath(e.path) + "/")
                    for k in keep_real
                )
            ]
            if extra:
                drift.append(f"{d} not empty: {extra[:3]}")
    return drift
