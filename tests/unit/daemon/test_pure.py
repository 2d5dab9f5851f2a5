"""Pure pieces of the daemon: request validation, path policy, rings, encoding."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sandman.daemon.config import Limits
from sandman.daemon.errors import BadRequest, Forbidden
from sandman.daemon.output import Capture, Ring, decode, encode
from sandman.daemon.paths import PathPolicy
from sandman.daemon.requests import exec_request, signal_request
from sandman.daemon.sessions import _MarkerStream

LIMITS = Limits()


def test_exec_request_defaults_and_shell() -> None:
    r = exec_request({"cmd": "ls -l"}, LIMITS)
    assert r.argv == ("/bin/sh", "-c", "ls -l")
    assert r.timeout_s == LIMITS.default_timeout_s
    assert r.max_output_bytes == LIMITS.default_output_bytes
    r = exec_request({"cmd": ["a", "b"], "timeout_s": 2, "max_output_bytes": 0}, LIMITS)
    assert (r.argv, r.timeout_s, r.max_output_bytes) == (("a", "b"), 2.0, 0)


@pytest.mark.parametrize(
    "body",
    [
        {"cmd": ["x"], "timeout_s": True},  # bool is not a number here
        {"cmd": ["x"], "timeout_s": float("inf")},
        {"cmd": ["x"], "max_output_bytes": 1.5},
        {"cmd": ["x"], "max_output_bytes": LIMITS.max_output_bytes + 1},
        {"cmd": ["x\0y"]},
        {"cmd": ["x"], "env": {"A=B": "c"}},
        {"cmd": ["x"], "stdin": "!!", "stdin_encoding": "base64"},
        {"cmd": ["x"], "stdin_encoding": "latin-1", "stdin": "a"},
        {"cmd": "   "},
        "just a string",
    ],
)
def test_exec_request_rejects(body: object) -> None:
    with pytest.raises(BadRequest):
        exec_request(body, LIMITS)


def test_signal_request() -> None:
    assert signal_request({"signal": "term"}) == 15
    assert signal_request({"signal": "SIGKILL"}) == 9
    assert signal_request({"signal": 2}) == 2
    assert signal_request({}) == 15
    for bad in ({"signal": "NOPE"}, {"signal": 0}, {"signal": True}, {"x": 1}):
        with pytest.raises(BadRequest):
            signal_request(bad)


def test_path_policy(tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "to-own").symlink_to(own)
    (work / "to-etc").symlink_to("/etc")
    policy = PathPolicy(allowed_roots=(work,), protected=(own,))
    assert policy.target(f"{work}/a/../b") == work / "b"
    with pytest.raises(Forbidden):
        policy.target(f"{work}/to-own/x")
    with pytest.raises(Forbidden):
        policy.target(f"{work}/to-etc/passwd")  # outside the allowed root
    with pytest.raises(Forbidden):
        policy.target(f"{work}/../own")
    # entry() acts on the link itself, which lives inside the root.
    assert policy.entry(f"{work}/to-etc") == work / "to-etc"
    for bad in ("", "relative", None, "/a\0b"):
        with pytest.raises(BadRequest):
            policy.target(bad)


def test_capture_and_encode() -> None:
    cap = Capture(5)
    cap(b"abc")
    cap(b"defgh")
    assert (cap.value(), cap.total, cap.truncated) == (b"abcde", 8, True)
    assert encode(b"caf\xc3\xa9") == ("café", "utf-8")
    assert encode(b"\xff") == ("/w==", "base64")
    # A cap that cut "é" in half keeps the text as text (only when truncated).
    assert encode(b"caf\xc3", truncated=True) == ("caf", "utf-8")
    assert encode(b"caf\xc3")[1] == "base64"
    assert decode("/w==", "base64") == b"\xff"


async def test_ring_offsets_and_drops() -> None:
    ring = Ring(10)
    ring(b"0123456789")
    ring(b"abcde")
    # 15 bytes written into a 10-byte ring: 5 dropped, offsets stay absolute.
    data, start, dropped = ring.read(0, 100)
    assert (data, start, dropped) == (b"56789abcde", 5, 5)
    assert ring.read(12, 2) == (b"cd", 12, 0)
    assert ring.end == 15
    waiter = asyncio.ensure_future(ring.wait_beyond(15, 5))
    await asyncio.sleep(0)
    ring(b"!")
    await asyncio.wait_for(waiter, 1)


def test_marker_stream_across_chunks() -> None:
    m = _MarkerStream(b"__MARK__", 100)
    for chunk in (b"hello\n__MA", b"RK__ 0 /tmp\n"):
        m(chunk)
    assert m.seen.is_set()
    assert m.capture.value() == b"hello"
    assert m.trailer == b" 0 /tmp\n"
    partial = _MarkerStream(b"__MARK__", 100)
    partial(b"no marker yet\n__MA")
    partial.flush()
    assert partial.capture.value() == b"no marker yet\n__MA"


def test_marker_stream_respects_cap() -> None:
    m = _MarkerStream(b"__M__", 4)
    m(os.urandom(0) + b"abcdefgh\n__M__ 3 /\n")
    assert m.capture.value() == b"abcd" and m.capture.truncated
