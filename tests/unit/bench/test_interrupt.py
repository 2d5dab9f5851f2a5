"""SIGTERM/Ctrl-C during a benchmark: the first raises, teardown runs, later
signals do not cut it short, and the previous handlers are back after."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from sandman.bench.interrupt import Interrupted, Latch, raising_on_signals


def test_latch_raises_once_then_only_notes() -> None:
    latch = Latch()
    first = latch.on_signal(signal.SIGTERM)
    assert isinstance(first, Interrupted)
    assert first.signum == signal.SIGTERM and first.exit_code == 143
    assert latch.on_signal(signal.SIGINT) is None
    assert latch.on_signal(signal.SIGTERM) is None
    assert latch.fired == [signal.SIGTERM, signal.SIGINT, signal.SIGTERM]


def test_interrupted_escapes_except_exception() -> None:
    # Health polls swallow Exception; the interruption must get past them.
    with pytest.raises(Interrupted):
        try:
            raise Interrupted(signal.SIGTERM)
        except Exception:
            pytest.fail("swallowed")


def test_sigterm_runs_finally_and_a_second_signal_does_not_abort_it() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    notes: list[str] = []
    torn_down = []
    with pytest.raises(Interrupted) as got, raising_on_signals(notes.append):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # let the handler run
            pytest.fail("not interrupted")
        finally:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during teardown
            torn_down.append("first half")
            torn_down.append("second half")
    assert got.value.signum == signal.SIGTERM
    assert torn_down == ["first half", "second half"]
    assert notes[0].startswith("SIGTERM: stopping") and notes[1].startswith("SIGINT again")
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_sigterm_inside_asyncio_run_unwinds_the_tasks() -> None:
    cleaned: list[str] = []

    async def helper() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append("helper")

    async def main() -> None:
        task = asyncio.create_task(helper())
        asyncio.get_running_loop().call_later(0.1, os.kill, os.getpid(), signal.SIGTERM)
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append("main")
            await task

    with pytest.raises(Interrupted), raising_on_signals(lambda _m: None):
        try:
            asyncio.run(main())
        finally:
            cleaned.append("cluster down")
    assert set(cleaned) == {"helper", "main", "cluster down"}
    assert cleaned[-1] == "cluster down"


def test_no_signal_no_change() -> None:
    with raising_on_signals(lambda _m: None) as latch:
        pass
    assert latch.fired == []
