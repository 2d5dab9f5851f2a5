"""Child processes: one reaper for all of them, spawning, killing whole trees.

As PID 1 (or a child subreaper) the daemon inherits every orphan in the
sandbox, so somebody must call ``waitpid(-1)`` or zombies pile up. Two waiters
steal each other's exit statuses: asyncio's child watchers and
``Popen.wait()`` then report 255 or 0 for commands that exited otherwise.
Hence the rule this module enforces: :class:`ChildReaper` is the only code
that waits, and every command is started through :func:`spawn`, which hands
its pid to the reaper before control returns to the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
# Children's oom_score_adj is the daemon's plus this (at most 1000), so that
# when a sandbox runs out of memory the OOM killer takes the command, never
# the daemon (whose death restarts the container and wipes the sandbox).
# +500 keeps the order inside the container while a Guaranteed pod's
# commands (-997 from the kubelet) stay well below other pods' processes on
# node pressure. Only raising works: lowering needs CAP_SYS_RESOURCE, which
# the container's root does not have.
CHILD_OOM_SCORE_ADJ_DELTA = 500
OOM_SCORE_ADJ_MAX = 1000


OOM_SCORE_ADJ = "/proc/self/oom_score_adj"


def _read_oom_score_adj() -> int | None:
    try:
        return int(Path(OOM_SCORE_ADJ).read_text())
    except (OSError, ValueError):
        return None


def _open_oom_score_adj() -> int | None:
    """A descriptor kept open for the raise/restore around every spawn: an
    open()/write()/close() of the /proc file costs tens of microseconds, a
    pwrite() on a kept descriptor about one (measured here: 84 vs 1.1 us per
    raise-and-restore pair)."""
    try:
        return os.open(OOM_SCORE_ADJ, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _write_oom_score_adj(fd: int, value: int) -> None:
    os.pwrite(fd, str(value).encode(), 0)


def child_oom_score_adj(own: int | None) -> int | None:
    """What spawn() gives children, from the daemon's own value (None: no /proc)."""
    if own is None:
        return None
    want = min(OOM_SCORE_ADJ_MAX, own + CHILD_OOM_SCORE_ADJ_DELTA)
    return want if want != own else None


def become_subreaper() -> bool:
    """Adopt orphans of our descendants even when we are not PID 1.

    Frozen, the daemon runs under a bootloader that is the real PID 1 and
    reaps only its own child; without this, orphaned grandchildren would
    become zombies of a process that never waits for them.
    """
    try:
        import ctypes  # only off PID 1 (tests, a host): ctypes costs ~1 MiB
    except ImportError:  # the runtime tree leaves ctypes out: a sandbox runs it as PID 1
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


class ChildReaper:
    """Waits for every child (``waitpid(-1, WNOHANG)`` on SIGCHLD).

    Exit codes are delivered to futures by pid; statuses of children nobody
    registered (adopted orphans) are counted and dropped. Not thread-safe:
    use it from the event loop thread only, which also makes "spawn, then
    register" atomic with respect to the SIGCHLD callback.
    """

    def __init__(self) -> None:
        self._waiters: dict[int, asyncio.Future[int]] = {}
        self._unclaimed: dict[int, int] = {}
        self.orphans_reaped = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._own_oom_score_adj = _read_oom_score_adj()
        self.child_oom_score_adj = child_oom_score_adj(self._own_oom_score_adj)
        self._oom_fd = _open_oom_score_adj() if self.child_oom_score_adj is not None else None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_signal_handler(signal.SIGCHLD, self.reap)
        self.reap()  # children that exited before the handler existed

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGCHLD)
            self._loop = None

    def watch(self, pid: int) -> asyncio.Future[int]:
        assert self._loop is not None, "reaper not started"
        fut: asyncio.Future[int] = self._loop.create_future()
        if pid in self._unclaimed:
            fut.set_result(self._unclaimed.pop(pid))
        else:
            self._waiters[pid] = fut
        return fut

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            fut = self._waiters.pop(pid, None)
            if fut is None:
                self.orphans_reaped += 1
            elif not fut.done():
                fut.set_result(code)

    @contextlib.contextmanager
    def children_oom_score_adj(self) -> Iterator[None]:
        """Children are forked with the raised oom_score_adj: the daemon raises
        its own for the spawn and goes back after (a process may return to its
        starting value without CAP_SYS_RESOURCE). Done in the parent because a
        preexec_fn would cost the vfork fast path on every command, and a write
        to the child's file after the spawn would race its first allocations."""
        want, fd = self.child_oom_score_adj, self._oom_fd
        if want is None or self._own_oom_score_adj is None or fd is None:
            yield
            return
        try:
            _write_oom_score_adj(fd, want)
        except OSError:
            self.child_oom_score_adj = None
            yield
            return
        try:
            yield
        finally:
            try:
                _write_oom_score_adj(fd, self._own_oom_score_adj)
            except OSError:  # cannot go back down: stop raising for good
                self.child_oom_score_adj = None

    @property
    def tracked(self) -> int:
        return len(self._waiters)


@dataclass
class Child:
    """A started command. ``exited`` resolves to its exit code (-N: signal N)."""

    pid: int
    exited: asyncio.Future[int]
    stdin: int | None = None
    stdout: int | None = None
    stderr: int | None = None


def spawn(
    reaper: ChildReaper,
    argv: Sequence[str],
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    stdin: bool = False,
    capture: bool = True,
    merge_stderr: bool = False,
) -> Child:
    """Start ``argv`` in a new session (own process group) with pipes.

    Raises OSError (ENOENT, EACCES, ...) when the command cannot be started.
    """
    # Raw pipes (no file objects around them: nothing buffers bytes behind
    # asyncio's back, and nothing to wrap and unwrap per command). A pipe for
    # stdin even when unused, not /dev/null: an image need not have /dev/null
    # (a bare rootfs), and EOF on a closed pipe reads the same.
    ours: list[int] = []  # the parent's ends, closed if the spawn fails
    theirs: list[int] = []  # the child's ends, closed in the parent after the spawn
    try:
        in_r, in_w = _pipe(ours, theirs, child_reads=True)
        out_r = out_w = err_r = err_w = None
        if capture:
            out_r, out_w = _pipe(ours, theirs, child_reads=False)
            if not merge_stderr:
                err_r, err_w = _pipe(ours, theirs, child_reads=False)
        with reaper.children_oom_score_adj():
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=in_r,
                stdout=out_w,
                stderr=out_w if merge_stderr else err_w,
                start_new_session=True,
                close_fds=True,
            )
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    # The reaper owns this pid's exit status. A Popen finalized with
    # returncode None would queue itself for a later waitpid(pid) of its own,
    # racing the reaper; a (placeholder) returncode makes it never wait.
    proc.returncode = 0
    if not stdin:
        os.close(in_w)  # EOF at once
    return Child(
        pid=proc.pid,
        exited=reaper.watch(proc.pid),
        stdin=in_w if stdin else None,
        stdout=out_r,
        stderr=err_r,
    )


def _pipe(ours: list[int], theirs: list[int], *, child_reads: bool) -> tuple[int, int]:
    """A close-on-exec pipe; our end non-blocking (asyncio reads or writes it)."""
    r, w = os.pipe2(os.O_CLOEXEC)
    mine, child = (w, r) if child_reads else (r, w)
    ours.append(mine)
    theirs.append(child)
    os.set_blocking(mine, False)
    return r, w


# ioctl request numbers from <asm-generic/ioctls.h> (x86_64 and arm64 share
# them): the termios extension module is not in the runtime tree for two
# constants.
TIOCSCTTY = 0x540E
TIOCSWINSZ = 0x5414


def set_window_size(fd: int, rows: int, cols: int) -> None:
    """Tell a terminal its size; the kernel sends SIGWINCH to its foreground group."""
    import fcntl  # built into the tree's interpreter; only terminals need it
    import struct

    fcntl.ioctl(fd, TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_controlling_terminal() -> None:  # pragma: no cover - runs in the child
    # After setsid() (start_new_session) and the dup2 of the terminal to fds
    # 0-2: make it the new session's controlling terminal, so that Ctrl-C
    # (ISIG) and SIGWINCH reach the program and job control works.
    import fcntl

    fcntl.ioctl(0, TIOCSCTTY, 0)


def spawn_pty(
    reaper: ChildReaper,
    argv: Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str],
    rows: int,
    cols: int,
) -> tuple[Child, int]:
    """Start ``argv`` on a new pseudo-terminal as the leader of its own session.

    Returns (child, master fd, non-blocking). The child's stdin, stdout and
    stderr are the terminal; raises OSError when it cannot start.
    """
    master, slave = os.openpty()
    try:
        set_window_size(slave, rows, cols)
        with reaper.children_oom_score_adj():
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env),
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
                close_fds=True,
                # A preexec_fn costs the vfork fast path; terminals are rare.
                preexec_fn=_take_controlling_terminal,
            )
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)  # the child holds it: EIO on the master once it is gone
    proc.returncode = 0  # the reaper owns the exit status (see spawn)
    os.set_blocking(master, False)
    return Child(pid=proc.pid, exited=reaper.watch(proc.pid)), master


# -- process trees ------------------------------------------------------------
def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, pgid) for every live process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        table[int(entry)] = (int(fields[1]), int(fields[2]))
    return table


def descendants(root: int, table: dict[int, tuple[int, int]] | None = None) -> list[int]:
    table = table if table is not None else _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = [], [root]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a command's process group and every descendant of it.

    The group catches the usual case in one syscall; the /proc walk catches
    descendants that started their own session (``setsid``, daemons). An
    orphan whose parent already died is adopted by us and is then found
    among our own children by :func:`kill_all_children`.
    """
    table = _proc_table()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    for p in [pid, *descendants(pid, table)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def kill_all_children(sig: int = signal.SIGKILL, keep: Callable[[int], bool] | None = None) -> int:
    """Signal every descendant of this process (all commands, orphans included)."""
    me = os.getpid()
    n = 0
    for p in descendants(me):
        if keep is not None and keep(p):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)
            n += 1
    return n
