"""The one git command the daemon runs, once, at first use, hardened anyway.

Reset runs no git at all (``gitread`` reads what it needs). At first use,
before any request is served, the sandbox is still the image's, and one
read-only ``git diff-files`` tells which tracked files differ from the index
(a fresh container's files never match the index's stat data, so git hashes
each with its fast SHA-1; the daemon's own is about ten times slower). Even
so it runs with every way a repository can make git execute something or see
another tree switched off, in case the image came with a hostile repository:

- ``GIT_CONFIG_NOSYSTEM=1``, ``GIT_CONFIG_GLOBAL=/dev/null``: no system or
  user config (the repository's own cannot be skipped; the ``-c`` below
  override every key that matters and command-line config wins);
- ``core.hooksPath=/dev/null``: no hooks (diff-files runs none anyway);
- ``core.fsmonitor=false``: the fsmonitor hook is a program from the config;
- ``GIT_NO_REPLACE_OBJECTS=1`` and ``--no-replace-objects``: ``refs/replace``
  cannot substitute objects;
- ``GIT_ATTR_NOSYSTEM=1``, ``core.attributesFile=/dev/null``: no system or
  user attributes; the repository's own may name filter drivers, whose
  ``clean`` command diff-files would run: ``survey`` never calls git when an
  attribute file mentions a filter (it hashes natively instead);
- ``core.untrackedCache=false``, ``core.splitIndex=false``, ``gc.auto=0``,
  ``maintenance.auto=false``, ``GIT_OPTIONAL_LOCKS=0``: nothing is written;
- ``GIT_NO_LAZY_FETCH=1``: a partial clone never fetches (no network, no
  credential helper); ``GIT_TERMINAL_PROMPT=0``, pager ``cat``;
- ``GIT_DIR``/``GIT_WORK_TREE`` given explicitly: ``core.worktree`` and a
  ``.git`` file cannot point git elsewhere; ``safe.directory=*`` because the
  checkout may belong to another uid; every other ``GIT_*`` variable of the
  image is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sandman.daemon.children import ChildReaper
from sandman.daemon.commands import run_command
from sandman.daemon.requests import ExecRequest

# diff-files hashes every tracked file of a fresh container (~0.2 s for a
# 60 MB checkout); a minute covers huge repositories on a loaded node.
TIMEOUT_S = 60.0
MAX_OUTPUT = 16 << 20  # the names of the files that differ

CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.attributesFile=/dev/null",
    "core.untrackedCache=false",
    "core.splitIndex=false",
    "core.pager=cat",
    "gc.auto=0",
    "maintenance.auto=false",
    "safe.directory=*",
)


def environment(base: Mapping[str, str], git_dir: Path, work_tree: Path) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith("GIT_")}
    env.update(
        GIT_DIR=str(git_dir),
        GIT_WORK_TREE=str(work_tree),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL="/dev/null",
        GIT_NO_REPLACE_OBJECTS="1",
        GIT_ATTR_NOSYSTEM="1",
        GIT_NO_LAZY_FETCH="1",
        GIT_OPTIONAL_LOCKS="0",
        GIT_TERMINAL_PROMPT="0",
        GIT_PAGER="cat",
    )
    return env


def argv(*args: str) -> tuple[str, ...]:
    out: list[str] = ["git", "--no-replace-objects"]
    for item in CONFIG:
        out += ["-c", item]
    return (*out, *args)


async def dirty_files(
    reaper: ChildReaper, base_env: Mapping[str, str], git_dir: Path, work_tree: Path
) -> set[str] | None:
    """Tracked paths whose content differs from the index; None if git could
    not tell (no git in the image, a timeout, an error): the caller hashes."""
    req = ExecRequest(
        argv=argv("diff-files", "--name-only", "-z", "--no-renames"),
        cwd=str(work_tree),
        env={},
        stdin=None,
        timeout_s=TIMEOUT_S,
        max_output_bytes=MAX_OUTPUT,
    )
    try:
        res = await run_command(reaper, req, environment(base_env, git_dir, work_tree))
    except Exception:  # no git binary, no /bin, a spawn error: fall back to hashing
        return None
    if res.exit_code != 0 or res.timed_out or res.truncated:
        return None
    return {p.decode("utf-8", "surrogateescape") for p in res.stdout.split(b"\0") if p}
