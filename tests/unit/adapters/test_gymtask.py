"""The Gymnasium adapter's pure parts: observations inside the space, transcripts,
and which errors are the infrastructure's (never a reward)."""

from __future__ import annotations

import pytest
from gymnasium import spaces

from sandman.adapters.gymtask import CHARSET, FileEdit, Task, is_submit, observation, step_text
from sandman.client import DaemonError, SandboxGone, SandboxStartError, TransportError
from sandman.fleet.retry import infra_failure
from sandman.kube_async import ApiError

SPACE = spaces.Text(64, min_length=0, charset=CHARSET)


@pytest.mark.parametrize(
    "text",
    ["", "ls -la\n\tok", "héllo wörld ✓", "\x00\x1b[31mred\x1b[0m", "x" * 1000],
)
def test_observations_always_fit_the_space(text: str) -> None:
    obs = observation(text, 64)
    assert SPACE.contains(obs), obs


def test_long_output_keeps_its_end_behind_a_marker() -> None:
    obs = observation("".join(f"line {i}\n" for i in range(100)), 64)
    assert obs.startswith("[... ") and obs.endswith("line 99\n") and len(obs) == 64


def test_the_daemons_session_script_path_never_reaches_the_agent() -> None:
    raw = "/.sandman/run/session-25ad35926a95/run-3.sh: line 1: X7j0: command not found\n"
    assert observation(raw, 1000) == "bash: line 1: X7j0: command not found\n"


@pytest.mark.parametrize(
    ("code", "timed_out", "want"),
    [
        (0, False, "out\n"),
        (2, False, "out\n[exit code 2]\n"),
        (-9, True, "out\n[timed out after 5s; the command was killed]\n"),
    ],
)
def test_step_text(code: int, timed_out: bool, want: str) -> None:
    assert step_text("out\n", code, timed_out, 5.0) == want


def test_submit_and_edits() -> None:
    assert is_submit(" submit\n") and not is_submit("submit now")
    assert not is_submit(FileEdit("/x", "submit"))


def test_tasks_need_room_for_a_step_before_truncation() -> None:
    with pytest.raises(ValueError):
        Task("t", "p", max_steps=1)


@pytest.mark.parametrize(
    ("error", "want"),
    [
        (SandboxStartError("Unschedulable", "no node", retryable=True), ("Unschedulable", True)),
        (SandboxStartError("ImageNotFound", "x", retryable=False), ("ImageNotFound", False)),
        (TransportError("reset"), ("Unreachable", True)),
        (SandboxGone("gone"), ("SandboxGone", True)),
        (DaemonError(503, "unavailable", "stopping"), ("Daemon503", True)),
        (ApiError(429, {}), ("Api429", True)),
        (ApiError(403, {}), ("Api403", False)),
        (TimeoutError(), ("TimeoutError", True)),
        # The agent's doing, not the infrastructure's: these are observations, not infra errors.
        (DaemonError(404, "not_found", "no such file"), None),
        (ValueError("bad task"), None),
    ],
)
def test_infra_failures_are_classified(error: Exception, want: tuple[str, bool] | None) -> None:
    assert infra_failure(error) == want
