"""Reset against an agent that attacks it. Each test is an attack that worked
on the reset that drove git (checkout/reset/clean/status in the workspace's
own repository): it made /v1/reset report ``clean: true`` over the agent's
tree, ran the agent's code during the reset, leaked its history into the
next rollout, or lost files of the pristine image. Now reset runs no program
from the image and verifies every recorded tree by content.

The "agent" is whatever runs through the daemon's exec, as in a sandbox.
"""

from __future__ import annotations

import os
import subprocess
import zlib
from pathlib import Path

import pytest

from tests.unit.daemon.helpers import Daemon, git, start_daemon, stop_daemon
from tests.unit.daemon.test_reset import make_workspace

pytestmark = pytest.mark.daemon_process

GIT_ID = "-c user.name=a -c user.email=a@a"


def _start(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[Daemon, Path]:
    ws, _ = make_workspace(tmp_path)
    (tmp_path / "tmp1").mkdir(exist_ok=True)
    d = start_daemon(
        tmp_path, f"--workspace={ws}", f"--temp-dir={tmp_path / 'tmp1'}", *extra, env=env
    )
    return d, ws


def _git(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ws), *args], capture_output=True, text=True)


def _agent(d: Daemon, ws: Path, script: str) -> None:
    res = d.exec(script, cwd=str(ws))
    assert res["exit_code"] == 0, res


def _pristine_again(ws: Path) -> None:
    """The checkout is exactly the first-use one, as git itself sees it."""
    assert (ws / "app.py").read_text() == "print('v1')\n"
    assert git(ws, "status", "--porcelain", "--ignored") == ""
    assert git(ws, "log", "--format=%s") == "pristine\n"


def test_replace_refs_cannot_pass_the_agents_tree_off_as_pristine(tmp_path: Path) -> None:
    d, ws = _start(tmp_path)
    try:
        pristine = git(ws, "rev-parse", "HEAD").strip()
        # The agent's commit stands in for the pristine one wherever git looks.
        _agent(
            d,
            ws,
            f"echo hacked > app.py && git {GIT_ID} commit -qam agent && "
            f"git replace {pristine} HEAD && git reset -q --hard {pristine}",
        )
        assert (ws / "app.py").read_text() == "hacked\n"
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is True, report
        _pristine_again(ws)
        assert git(ws, "replace", "-l") == ""
    finally:
        stop_daemon(d)


@pytest.mark.parametrize(
    "plant",
    [
        # core.fsmonitor names a program git runs on status/diff.
        "git config core.fsmonitor {hook}",
        # Hooks run on checkout, reset, commit.
        "for h in post-checkout post-merge reference-transaction pre-auto-gc; do "
        "cp {hook} .git/hooks/$h; done",
        # A filter driver named by attributes runs on checkout (smudge) and
        # on status/add (clean).
        "git config filter.evil.smudge {hook} && git config filter.evil.clean {hook} && "
        "echo '* filter=evil' > .git/info/attributes",
    ],
    ids=["fsmonitor", "hooks", "filters"],
)
def test_reset_runs_none_of_the_agents_code(tmp_path: Path, plant: str) -> None:
    d, ws = _start(tmp_path)
    marker = tmp_path / "pwned"
    hook = tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\necho ran >> {marker}\ncat\n")
    hook.chmod(0o755)
    hooks_before = sorted(os.listdir(ws / ".git" / "hooks"))
    try:
        _agent(d, ws, plant.format(hook=hook) + " && echo hacked > app.py")
        report = d.ok("POST", "/v1/reset")
        assert not marker.exists(), "reset ran a program the agent planted"
        assert report["clean"] is True, report
        # ... and the next rollout does not inherit the planted config either.
        assert _git(ws, "config", "--get-regexp", "fsmonitor|filter").stdout == ""
        assert sorted(os.listdir(ws / ".git" / "hooks")) == hooks_before
        assert not (ws / ".git" / "info" / "attributes").exists()
        _pristine_again(ws)
    finally:
        stop_daemon(d)


def test_a_replaced_git_binary_is_never_run(tmp_path: Path) -> None:
    """The image's git is the agent's to replace (it is root in its sandbox)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    marker = tmp_path / "pwned"
    env = {"PATH": f"{bindir}:{os.environ['PATH']}"}
    d, ws = _start(tmp_path, env=env)
    try:
        real = "/usr/bin/git"
        fake = bindir / "git"
        _agent(
            d,
            ws,
            f"printf '#!/bin/sh\\necho ran >> {marker}\\nexec {real} \"$@\"\\n' > {fake} && "
            f"chmod +x {fake} && echo hacked > app.py",
        )
        report = d.ok("POST", "/v1/reset")
        assert not marker.exists(), "reset ran the agent's git"
        assert report["clean"] is True, report
        _pristine_again(ws)
    finally:
        stop_daemon(d)


def test_index_flags_cannot_hide_an_edit(tmp_path: Path) -> None:
    d, ws = _start(tmp_path)
    try:
        _agent(d, ws, "echo hacked > app.py && git update-index --skip-worktree app.py")
        assert git(ws, "status", "--porcelain") == ""  # git no longer looks at it
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is True, report
        _pristine_again(ws)
        assert "S " not in git(ws, "ls-files", "-v")
    finally:
        stop_daemon(d)


def test_core_worktree_cannot_send_the_restore_elsewhere(tmp_path: Path) -> None:
    d, ws = _start(tmp_path)
    decoy = tmp_path / "decoy"
    try:
        _agent(
            d,
            ws,
            f"cp -r {ws} {decoy} && rm -rf {decoy}/.git && echo hacked > app.py && "
            f"git config core.worktree {decoy}",
        )
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is True, report
        _pristine_again(ws)
    finally:
        stop_daemon(d)


def test_an_altered_object_is_caught_not_restored(tmp_path: Path) -> None:
    """git does not check a loose object against its id when it reads it."""
    d, ws = _start(tmp_path)
    try:
        blob = git(ws, "rev-parse", "HEAD:app.py").strip()
        obj = ws / ".git" / "objects" / blob[:2] / blob[2:]
        body = b"print('v2 from the agent')\n"
        forged = zlib.compress(b"blob %d\0" % len(body) + body)
        _agent(d, ws, f"chmod u+w {obj} && echo hacked > app.py")
        obj.write_bytes(forged)  # (the agent could as well: it is the same user)
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is False, report
        assert any(blob[2:] in line for line in report["drift"]), report
        assert (ws / "app.py").read_text() != "print('v2 from the agent')\n"
    finally:
        stop_daemon(d)


def test_the_previous_rollouts_history_does_not_leak(tmp_path: Path) -> None:
    d, ws = _start(tmp_path)
    try:
        _agent(
            d,
            ws,
            f"echo solution > app.py && git {GIT_ID} commit -qam 'the answer' && "
            f"echo more > app.py && git {GIT_ID} stash -q && git tag solved HEAD",
        )
        agent_commit = git(ws, "rev-parse", "solved").strip()
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is True, report
        _pristine_again(ws)
        # Neither refs, reflogs nor unreachable objects keep the agent's work.
        assert "the answer" not in git(ws, "reflog", "--all", "--format=%s")
        assert git(ws, "stash", "list") == "" and git(ws, "tag") == ""
        assert _git(ws, "cat-file", "-e", agent_commit).returncode != 0
    finally:
        stop_daemon(d)


def test_pristine_untracked_and_ignored_files_are_kept_and_restored(tmp_path: Path) -> None:
    """An image's `pip install -e .` leaves ignored build outputs in the
    checkout: `git clean -ffdx` deleted them, breaking the next rollout."""
    ws, _ = make_workspace(tmp_path)
    (ws / "pkg.egg-info").mkdir()
    (ws / "pkg.egg-info" / "PKG-INFO").write_text("Name: pkg\n")
    (ws / "build.log").write_text("built\n")  # ignored (*.log)
    (tmp_path / "tmp1").mkdir()
    d = start_daemon(tmp_path, f"--workspace={ws}", f"--temp-dir={tmp_path / 'tmp1'}")
    try:
        _agent(d, ws, "echo agent > build.log && rm -r pkg.egg-info && echo x > new.log")
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is True, report
        assert (ws / "pkg.egg-info" / "PKG-INFO").read_text() == "Name: pkg\n"
        assert (ws / "build.log").read_text() == "built\n"
        assert not (ws / "new.log").exists()
    finally:
        stop_daemon(d)


def test_a_workspace_inside_a_temp_dir_is_not_emptied(tmp_path: Path) -> None:
    tmp1 = tmp_path / "tmp1"
    tmp1.mkdir()
    ws, _ = make_workspace(tmp1)
    d = start_daemon(tmp_path, f"--workspace={ws}", f"--temp-dir={tmp1}")
    try:
        _agent(d, ws, f"echo junk > {tmp1}/junk")
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is True, report
        assert (ws / "app.py").read_text() == "print('v1')\n" and not (tmp1 / "junk").exists()
    finally:
        stop_daemon(d)


def test_installed_python_packages_are_verified(tmp_path: Path) -> None:
    site = tmp_path / "py" / "lib" / "python3.11" / "site-packages"
    (site / "_pytest").mkdir(parents=True)
    (site / "_pytest" / "runner.py").write_text("def run(): return 'real'\n")
    (site / "pytest-8.0.dist-info").mkdir()
    (site / "pytest-8.0.dist-info" / "RECORD").write_text("_pytest/runner.py,sha256=x,25\n")
    pyroot = site.parent
    d, ws = _start(tmp_path, f"--python-dirs={pyroot}")
    try:
        # Caches are not drift: they are removed (a planted .pyc is one).
        _agent(
            d,
            ws,
            f"mkdir -p {site}/_pytest/__pycache__ && echo x > "
            f"{site}/_pytest/__pycache__/runner.cpython-311.pyc",
        )
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is True, report
        assert not (site / "_pytest" / "__pycache__").exists()
        # A patched test runner, a sitecustomize, a package installed: drift.
        _agent(
            d,
            ws,
            f"echo \"def run(): return 'passed'\" > {site}/_pytest/runner.py && "
            f"echo 'import os' > {site}/sitecustomize.py && mkdir {site}/evil-1.0.dist-info",
        )
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is False
        text = "\n".join(report["drift"])
        assert "_pytest/runner.py" in text and "sitecustomize.py" in text, text
    finally:
        stop_daemon(d)


def test_files_named_by_the_pod_are_verified_and_a_fifo_never_hangs(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text("numpy==2.0\n")
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "settings.ini").write_text("a=1\n")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # a blocking open() of it froze the daemon at start
    env = {"SANDMAN_MANIFESTS": f"{lock},{conf}, {fifo}"}
    d, ws = _start(tmp_path, env=env)
    try:
        assert d.ok("POST", "/v1/reset")["clean"] is True
        _agent(d, ws, f"echo b=2 >> {conf}/settings.ini && rm {fifo} && echo x > {fifo}")
        report = d.ok("POST", "/v1/reset", timeout=30)
        assert report["clean"] is False
        text = "\n".join(report["drift"])
        assert "settings.ini" in text and str(fifo) in text, text
        # The manifest swapped for a FIFO: reset must not block on it.
        os.unlink(fifo)
        os.mkfifo(fifo)
        lock.unlink()
        os.mkfifo(lock)
        report = d.ok("POST", "/v1/reset", timeout=30)
        assert any("requirements.lock" in x for x in report["drift"]), report
        assert d.request("GET", "/healthz", timeout=5) == (200, {"ok": True})
    finally:
        stop_daemon(d)


def test_a_restarted_daemon_does_not_trust_a_record_the_agent_rewrote(tmp_path: Path) -> None:
    """The record on disk is the agent's to edit; a restart used to believe it."""
    d, ws = _start(tmp_path)
    own = tmp_path / "d"
    agent_head = ""
    try:
        _agent(d, ws, f"echo hacked > app.py && git {GIT_ID} commit -qam agent")
        agent_head = git(ws, "rev-parse", "HEAD").strip()
        # Whatever the daemon keeps, rewrite it to describe the agent's state.
        for f in own.iterdir():
            if f.name.startswith("pristine") and f.is_file():
                data = f.read_bytes()
                pristine = git(ws, "rev-parse", "HEAD~1").strip()
                f.write_bytes(data.replace(pristine.encode(), agent_head.encode()) + b" ")
        # While it runs, the daemon notices and says so.
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is False and any("altered" in x for x in report["drift"])
        _agent(d, ws, f"echo hacked > app.py && git {GIT_ID} commit -qam agent2")
        agent_head = git(ws, "rev-parse", "HEAD").strip()
        for f in own.iterdir():
            if f.name.startswith("pristine") and f.is_file():
                f.write_bytes(f.read_bytes() + b"tampered")
    finally:
        stop_daemon(d)
    d = start_daemon(tmp_path, f"--workspace={ws}", f"--temp-dir={tmp_path / 'tmp1'}")
    try:
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is False, report
        assert report["pristine"]["trusted"] is False
        assert git(ws, "rev-parse", "HEAD").strip() == agent_head  # nothing "restored" to it
    finally:
        stop_daemon(d)


def test_the_agent_cannot_open_the_daemons_memory(tmp_path: Path) -> None:
    """Same user, same capabilities as the daemon (a root agent in a container
    without CAP_SYS_PTRACE): /proc/PID/mem, and so ptrace, stay closed, and
    the in-memory pristine record with them. (Before, the daemon was dumpable:
    the open succeeded and only reading unmapped address 0 failed.)"""
    if os.geteuid() != 0:
        pytest.skip("the daemon makes itself non-dumpable only as root")
    d = start_daemon(
        tmp_path,
        wrapper=("setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace", "--"),
    )
    try:
        res = d.exec(["head", "-c", "1", f"/proc/{d.proc.pid}/mem"])
        assert res["exit_code"] != 0
        assert "cannot open" in res["stderr"] and "Permission denied" in res["stderr"], res
    finally:
        stop_daemon(d)


def test_objects_git_freshens_in_a_packed_repository_are_not_drift(tmp_path: Path) -> None:
    """Writing an object git already has only touches its file (new ctime):
    the pack is checked by content (hashed after start-up), not called drift."""
    ws, _ = make_workspace(tmp_path)
    git(ws, "gc", "-q")
    assert not [p for p in (ws / ".git" / "objects").iterdir() if len(p.name) == 2]
    (tmp_path / "tmp1").mkdir()
    d = start_daemon(tmp_path, f"--workspace={ws}", f"--temp-dir={tmp_path / 'tmp1'}")
    try:
        pack = next((ws / ".git" / "objects" / "pack").glob("*.pack"))
        before = os.stat(pack).st_ctime_ns
        _agent(d, ws, f"cp app.py copy.py && git add copy.py && git {GIT_ID} commit -qm agent")
        assert os.stat(pack).st_ctime_ns != before  # freshened
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is True, report
        _pristine_again(ws)
    finally:
        stop_daemon(d)


def test_loose_objects_git_packed_away_are_written_again(tmp_path: Path) -> None:
    """git's automatic gc (over 6700 loose objects) packs the pristine loose
    objects and deletes them: reset writes them again from the new pack."""
    d, ws = _start(tmp_path)
    try:
        _agent(d, ws, f"echo v2 > app.py && git {GIT_ID} commit -qam agent && git gc -q")
        assert not [p for p in (ws / ".git" / "objects").iterdir() if len(p.name) == 2]
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is True, report
        _pristine_again(ws)
        assert not list((ws / ".git" / "objects" / "pack").glob("*.pack"))
        assert git(ws, "fsck", "--no-dangling") == ""
    finally:
        stop_daemon(d)


def test_a_hostile_repository_in_the_image_runs_nothing_at_first_use(tmp_path: Path) -> None:
    """The one git command the daemon runs (diff-files, before the first
    request) runs hardened: the repository's fsmonitor, hooks, pager and
    core.worktree are ignored, and its filter drivers make the daemon hash
    natively instead of asking git at all."""
    marker = tmp_path / "pwned"
    hook = tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\necho ran >> {marker}\ncat\n")
    hook.chmod(0o755)
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    ws, _ = make_workspace(tmp_path)
    for key, value in (
        ("core.fsmonitor", str(hook)),
        ("core.hooksPath", str(tmp_path)),
        ("core.pager", str(hook)),
        ("core.worktree", str(decoy)),
    ):
        git(ws, "config", key, value)
    for name in ("post-index-change", "reference-transaction"):
        (tmp_path / name).write_text(hook.read_text())
        (tmp_path / name).chmod(0o755)
    (tmp_path / "tmp1").mkdir()
    d = start_daemon(tmp_path, f"--workspace={ws}", f"--temp-dir={tmp_path / 'tmp1'}")
    try:
        assert not marker.exists(), "first use ran the repository's code"
        _agent(d, ws, "echo hacked > app.py")
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is True, report
        assert (ws / "app.py").read_text() == "print('v1')\n"
        assert not marker.exists()
    finally:
        stop_daemon(d)
    # Filter drivers named in the attributes: the daemon does not call git.
    ws2 = tmp_path / "second"
    ws2.mkdir()
    git(ws2, "init", "-q", "-b", "main")
    (ws2 / ".gitattributes").write_text("*.py filter=evil\n")
    (ws2 / "app.py").write_text("print('v1')\n")
    git(ws2, "add", "-A")
    git(ws2, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pristine")
    git(ws2, "config", "filter.evil.clean", str(hook))
    git(ws2, "config", "filter.evil.smudge", str(hook))
    marker.unlink(missing_ok=True)
    (tmp_path / "d2").mkdir()
    d = start_daemon(
        tmp_path,
        f"--workspace={ws2}",
        f"--temp-dir={tmp_path / 'tmp1'}",
        f"--daemon-dir={tmp_path / 'd2'}",
    )
    try:
        assert not marker.exists(), "first use ran a filter driver"
        _agent(d, ws2, "echo hacked > app.py")
        report = d.ok("POST", "/v1/reset")
        assert report["clean"] is True, report
        assert (ws2 / "app.py").read_text() == "print('v1')\n" and not marker.exists()
    finally:
        stop_daemon(d)
