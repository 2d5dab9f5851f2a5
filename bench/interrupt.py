"""SIGTERM and Ctrl-C as an exception, so a benchmark tears down what it started.

Python's default SIGTERM action ends the process at once: no ``finally``, no
context-manager exit, and the private cluster a benchmark started (etcd, the
apiserver, a kubelet, containerd: detached in their own sessions, so the
signal never reaches them) keeps running. While ``raising_on_signals`` is
active the first SIGTERM or SIGINT raises ``Interrupted`` in the main thread,
which unwinds through the benchmark's ``finally`` blocks (and, inside
``asyncio.run``, through the cancellation of its tasks). Further signals only
print a notice: a second Ctrl-C must not abort the teardown half-way and
leave half a cluster behind.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """A signal asked the benchmark to stop. A KeyboardInterrupt so that
    ``except Exception`` (health polls, retries) never swallows it and asyncio
    propagates it out of a task at once, as it does Ctrl-C."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@dataclass
class Latch:
    """What each signal does: the first raises, the later ones do not."""

    fired: list[int] = field(default_factory=list)

    def on_signal(self, signum: int) -> Interrupted | None:
        self.fired.append(signum)
        return Interrupted(signum) if len(self.fired) == 1 else None


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def raising_on_signals(notice: Callable[[str], None] = _stderr) -> Iterator[Latch]:
    """Within the block, SIGTERM/SIGINT raise ``Interrupted`` once; the previous
    handlers are back after it. Outside the main thread (where Python cannot
    install handlers) the block runs unchanged."""
    latch = Latch()
    if threading.current_thread() is not threading.main_thread():
        yield latch
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        exc = latch.on_signal(signum)
        name = signal.Signals(signum).name
        if exc is not None:
            notice(f"{name}: stopping; tearing down what this run started")
            raise exc
        notice(f"{name} again: still tearing down (SIGKILL abandons the cluster)")

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield latch
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
