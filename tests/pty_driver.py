"""Drive a program through a pseudo-terminal, as a person at a terminal would.

The program gets the terminal as its controlling terminal (its own session),
so raw mode, SIGWINCH on resize and job control behave as in a real one.
Tests type into it and read its screen output.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Mapping, Sequence


class PtyDriver:
    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        rows: int = 24,
        cols: int = 80,
        timeout: float = 60.0,
    ) -> None:
        self.timeout = timeout
        self.master, self.slave = os.openpty()
        self.resize(rows, cols)
        # What the terminal looked like before the program: it must look the
        # same after (the program restores the user's terminal).
        self.initial_modes = termios.tcgetattr(self.slave)
        self.proc = subprocess.Popen(
            list(argv),
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            preexec_fn=_controlling_terminal,
            close_fds=True,
        )
        self.out = b""  # everything read and not yet consumed by expect()
        self.log = b""  # everything read

    def resize(self, rows: int, cols: int) -> None:
        """Like a terminal window changing size: the foreground group gets SIGWINCH."""
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, text: str | bytes) -> None:
        os.write(self.master, text.encode() if isinstance(text, str) else text)

    def _read(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([self.master], [], [], left)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the program and everything on the terminal exited
            data = b""
        if not data:
            raise EOFError(f"terminal closed; output so far:\n{self.log[-3000:]!r}")
        self.out += data
        self.log += data
        return True

    def expect(self, text: str | bytes, timeout: float | None = None) -> bytes:
        """Read until ``text`` appears; returns the output up to and including it."""
        want = text.encode() if isinstance(text, str) else text
        deadline = time.monotonic() + (timeout or self.timeout)
        while want not in self.out:
            if not self._read(deadline):
                raise AssertionError(
                    f"no {want!r} within {timeout or self.timeout:.0f}s; "
                    f"output so far:\n{self.log[-3000:]!r}"
                )
        i = self.out.index(want) + len(want)
        seen, self.out = self.out[:i], self.out[i:]
        return seen

    def wait(self, timeout: float | None = None) -> int:
        """The program's exit status, reading its last output meanwhile."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while self.proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(EOFError):
                self._read(min(deadline, time.monotonic() + 0.2))
        try:
            return self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running after {timeout or self.timeout:.0f}s; output:\n{self.log[-3000:]!r}"
            ) from None

    def modes_restored(self) -> bool:
        return termios.tcgetattr(self.slave) == self.initial_modes

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for fd in (self.master, self.slave):
            with contextlib.suppress(OSError):
                os.close(fd)


def _controlling_terminal() -> None:  # runs in the child, after setsid
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
