"""Validation of request bodies into typed requests (pure; no I/O).

Unknown fields are refused rather than ignored: a misspelt ``timeout_s``
silently falling back to the default is exactly the bug an agent framework
never notices.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sandman.daemon.config import Limits
from sandman.daemon.errors import BadRequest
from sandman.daemon.output import decode

SHELL = ("/bin/sh", "-c")


def os_string(value: str, what: str) -> str:
    """A string the OS can take as an argument, path or environment entry: no
    NUL byte, and bytes for every character (a lone surrogate like \\ud800
    has none; \\udc80-\\udcff stand for undecodable bytes and are fine)."""
    if "\0" in value:
        raise BadRequest(f"{what} must not contain NUL bytes")
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        raise BadRequest(f"{what} holds characters with no byte encoding: {value[:50]!r}") from None
    return value


def _check_fields(body: Any, allowed: set[str], what: str) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest(f"{what}: the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(
            f"{what}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )
    return body


def _str(body: Mapping[str, Any], key: str, *, default: str | None = None) -> str | None:
    v = body.get(key, default)
    if v is not None and not isinstance(v, str):
        raise BadRequest(f"{key} must be a string")
    return v if v is None else os_string(v, key)


def _num(body: Mapping[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise BadRequest(f"{key} must be a number")
    if not lo <= v <= hi:
        raise BadRequest(f"{key} must be between {lo:g} and {hi:g}, got {v:g}")
    return float(v)


def _int(body: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    v = _num(body, key, default, lo, hi)
    if v != int(v):
        raise BadRequest(f"{key} must be an integer")
    return int(v)


def _env(body: Mapping[str, Any]) -> dict[str, str]:
    env = body.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise BadRequest("env must be an object of string values")
    for k, v in env.items():
        if not k or "=" in k:
            raise BadRequest(f"invalid environment variable name {k!r}")
        os_string(k, "an environment variable name")
        os_string(v, f"environment variable {k}")
    return env


def _argv(body: Mapping[str, Any]) -> tuple[str, ...]:
    cmd = body.get("cmd")
    if isinstance(cmd, str):
        if not cmd.strip():
            raise BadRequest("cmd must not be empty")
        return (*SHELL, os_string(cmd, "cmd"))
    if isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd):
        return tuple(os_string(a, "cmd arguments") for a in cmd)
    raise BadRequest("cmd must be a non-empty list of strings (argv) or a shell string")


def _stdin(body: Mapping[str, Any]) -> bytes | None:
    stdin = body.get("stdin")
    if stdin is None:
        return None
    if not isinstance(stdin, str):
        raise BadRequest("stdin must be a string")
    encoding = _str(body, "stdin_encoding", default="utf-8")
    if encoding not in ("utf-8", "base64"):
        raise BadRequest("stdin_encoding must be utf-8 or base64")
    try:
        return decode(stdin, encoding)
    except ValueError as e:
        raise BadRequest(f"stdin is not valid {encoding}: {e}") from None


@dataclass(frozen=True)
class ExecRequest:
    argv: tuple[str, ...]
    cwd: str | None
    env: dict[str, str]
    stdin: bytes | None
    timeout_s: float
    max_output_bytes: int


EXEC_FIELDS = {"cmd", "cwd", "env", "stdin", "stdin_encoding", "timeout_s", "max_output_bytes"}


def exec_request(body: Any, limits: Limits) -> ExecRequest:
    b = _check_fields(body, EXEC_FIELDS, "exec")
    return ExecRequest(
        argv=_argv(b),
        cwd=_str(b, "cwd"),
        env=_env(b),
        stdin=_stdin(b),
        timeout_s=_num(b, "timeout_s", limits.default_timeout_s, 0.001, limits.max_timeout_s),
        max_output_bytes=_int(
            b, "max_output_bytes", limits.default_output_bytes, 0, limits.max_output_bytes
        ),
    )


@dataclass(frozen=True)
class StartRequest:
    """A background process."""

    argv: tuple[str, ...]
    cwd: str | None
    env: dict[str, str]
    stdin: bool  # keep stdin open for later writes
    name: str | None
    keeps_active: bool = True  # while it runs, the sandbox is not idle


def start_request(body: Any) -> StartRequest:
    b = _check_fields(body, {"cmd", "cwd", "env", "stdin", "name", "keeps_active"}, "process")
    stdin = b.get("stdin", False)
    if not isinstance(stdin, bool):
        raise BadRequest("stdin must be a boolean (keep stdin open for writes)")
    keeps_active = b.get("keeps_active", True)
    if not isinstance(keeps_active, bool):
        raise BadRequest("keeps_active must be a boolean")
    return StartRequest(_argv(b), _str(b, "cwd"), _env(b), stdin, _str(b, "name"), keeps_active)


@dataclass(frozen=True)
class SessionRequest:
    cwd: str | None
    env: dict[str, str]
    shell: str | None


def session_request(body: Any) -> SessionRequest:
    b = _check_fields(body or {}, {"cwd", "env", "shell"}, "session")
    return SessionRequest(_str(b, "cwd"), _env(b), _str(b, "shell"))


@dataclass(frozen=True)
class RunRequest:
    """One command in a persistent shell session."""

    cmd: str
    stdin: bytes | None
    timeout_s: float
    max_output_bytes: int


def run_request(body: Any, limits: Limits) -> RunRequest:
    b = _check_fields(
        body, {"cmd", "stdin", "stdin_encoding", "timeout_s", "max_output_bytes"}, "session run"
    )
    cmd = b.get("cmd")
    if not isinstance(cmd, str) or not cmd.strip():
        raise BadRequest("cmd must be a non-empty shell string")
    return RunRequest(
        cmd=cmd,
        stdin=_stdin(b),
        timeout_s=_num(b, "timeout_s", limits.default_timeout_s, 0.001, limits.max_timeout_s),
        max_output_bytes=_int(
            b, "max_output_bytes", limits.default_output_bytes, 0, limits.max_output_bytes
        ),
    )


def signal_request(body: Any) -> int:
    b = _check_fields(body, {"signal"}, "signal")
    sig = b.get("signal", "TERM")
    if isinstance(sig, int) and not isinstance(sig, bool):
        if not 1 <= sig <= 64:
            raise BadRequest("signal number out of range")
        return sig
    if isinstance(sig, str):
        name = sig.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        try:
            return int(signal.Signals[name])
        except KeyError:
            raise BadRequest(f"unknown signal {sig!r}") from None
    raise BadRequest("signal must be a name (TERM, KILL, INT, ...) or a number")


def optional_fields(body: Any, allowed: set[str], what: str) -> Mapping[str, Any]:
    """Check a small body (or none) against the fields it may have."""
    return _check_fields(body if body is not None else {}, allowed, what)


@dataclass(frozen=True)
class PtyRequest:
    """An interactive program on a pseudo-terminal (``/v1/pty``'s first message)."""

    argv: tuple[str, ...] | None  # None: the image's shell
    cwd: str | None
    env: dict[str, str]
    rows: int
    cols: int
    term: str


PTY_FIELDS = {"cmd", "cwd", "env", "rows", "cols", "term"}
# struct winsize holds unsigned shorts; real terminals stay far below.
MAX_PTY_SIZE = 4096


def pty_request(body: Any) -> PtyRequest:
    b = _check_fields(body, PTY_FIELDS, "pty")
    term = _str(b, "term", default="xterm-256color") or "xterm-256color"
    if "\0" in term or "=" in term:
        raise BadRequest("term must be a terminal type name such as xterm-256color")
    return PtyRequest(
        argv=_argv(b) if b.get("cmd") is not None else None,
        cwd=_str(b, "cwd"),
        env=_env(b),
        rows=_int(b, "rows", 24, 1, MAX_PTY_SIZE),
        cols=_int(b, "cols", 80, 1, MAX_PTY_SIZE),
        term=term,
    )


def resize_request(body: Any) -> tuple[int, int]:
    b = _check_fields(body, {"type", "rows", "cols"}, "resize")
    return _int(b, "rows", 24, 1, MAX_PTY_SIZE), _int(b, "cols", 80, 1, MAX_PTY_SIZE)
