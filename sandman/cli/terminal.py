"""The local side of an interactive terminal in a sandbox (`kubectl sandman shell`).

The sandbox's daemon runs the program on a pseudo-terminal
(sandman.client.pty); here the user's own terminal is put in raw mode, so
every key (Ctrl-C, Ctrl-D, arrows, Esc) goes to the program untouched and
the program's terminal handles it as a local one would; window changes
(SIGWINCH) are sent along as resizes. The terminal is restored on every way
out: the program exits, the connection is lost, an error, or this process is
told to stop (SIGTERM, SIGHUP, SIGINT from another process).

    code = await interactive(sandbox)            # the image's shell
    code = await interactive(sandbox, ["python3"])
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import termios
import tty
from collections.abc import Iterator, Mapping, Sequence

from sandman.client.pty import Terminal
from sandman.client.sandbox import Sandbox

# Exit status when the connection ended before the program did: Sandman's
# own failure code (docs/cli.md), as every command uses for its failures.
LOST = 125
# Signals that end this process politely: each restores the terminal first.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
READ_CHUNK = 64 << 10
# What a program gets when the terminal's size cannot be read (a pipe).
DEFAULT_SIZE = (24, 80)


def window_size(fd: int) -> tuple[int, int]:
    """(rows, cols) of the terminal on ``fd``."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return DEFAULT_SIZE
    return (size.lines or DEFAULT_SIZE[0], size.columns or DEFAULT_SIZE[1])


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """Raw mode on the terminal ``fd`` (no echo, no line editing, no signals
    from keys, no output processing), and its settings back on the way out,
    whatever the way out is."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        # TCSADRAIN: what the program wrote last is shown before the local
        # shell's settings come back.
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


async def attach(term: Terminal, stdin_fd: int, stdout_fd: int) -> int | None:
    """Wire ``term`` to local fds until its program ends; its exit code (None:
    the connection was lost). The caller owns the terminal modes."""
    loop = asyncio.get_running_loop()
    outbox: asyncio.Queue[bytes | tuple[int, int] | None] = asyncio.Queue()

    def on_input() -> None:
        try:
            data = os.read(stdin_fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # EOF on a non-terminal stdin: stop reading it
            loop.remove_reader(stdin_fd)
            return
        outbox.put_nowait(data)

    def on_winch() -> None:
        outbox.put_nowait(window_size(stdout_fd))

    async def send() -> None:
        # One sender: keystrokes and resizes reach the program in order.
        while (item := await outbox.get()) is not None:
            if isinstance(item, bytes):
                await term.write(item)
            else:
                await term.resize(*item)

    loop.add_reader(stdin_fd, on_input)
    loop.add_signal_handler(signal.SIGWINCH, on_winch)
    sender = asyncio.ensure_future(send())
    try:
        async for chunk in term:
            _write_all(stdout_fd, chunk)
            if sender.done():
                sender.result()  # raise what stopped the input side
    finally:
        loop.remove_reader(stdin_fd)
        loop.remove_signal_handler(signal.SIGWINCH)
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sender
    return term.exit_code


def exit_status(code: int | None) -> int:
    """The program's exit code as ours: 128+N for signal N, LOST without one."""
    if code is None:
        return LOST
    return code if code >= 0 else 128 - code


async def interactive(
    sandbox: Sandbox,
    cmd: str | Sequence[str] | None = None,
    *,
    stdin_fd: int | None = None,
    stdout_fd: int | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run ``cmd`` (default: the image's shell) on a terminal in ``sandbox``,
    attached to this process's terminal; returns the exit status to exit with."""
    stdin_fd = sys.stdin.fileno() if stdin_fd is None else stdin_fd
    stdout_fd = sys.stdout.fileno() if stdout_fd is None else stdout_fd
    rows, cols = window_size(stdout_fd)
    term_type = os.environ.get("TERM") or "xterm-256color"
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    assert me is not None
    stopped: list[int] = []

    def stop(sig: int) -> None:
        stopped.append(sig)
        me.cancel()

    pty = sandbox.pty(cmd, rows=rows, cols=cols, term=term_type, cwd=cwd, env=env)
    async with await pty as term:
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, stop, sig)
        try:
            with raw_mode(stdin_fd):
                code = await attach(term, stdin_fd, stdout_fd)
        except asyncio.CancelledError:
            if not stopped:
                raise
            me.uncancel()
            return 128 + stopped[0]  # as a shell reports a process killed by it
        finally:
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)
    if code is None:
        print(f"error: the connection to {sandbox.name} was lost", file=sys.stderr)
    return exit_status(code)
