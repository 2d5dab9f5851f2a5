"""Whose fault a failed attempt is, and what the fleet does next."""

from __future__ import annotations

import pytest

from sandman.client.errors import (
    DaemonError,
    SandboxGone,
    SandboxStartError,
    TransportError,
)
from sandman.fleet.retry import AfterFailure, after_failure, infra_failure
from sandman.kube_async import ApiError

E = SandboxStartError


def _api(status: int) -> ApiError:
    return ApiError(status, {"reason": "Failure", "message": f"status {status}"})


@pytest.mark.parametrize(
    ("error", "want"),
    [
        (E(E.IMAGE_NOT_FOUND, "manifest unknown", retryable=False), ("ImageNotFound", False)),
        (E(E.TIMEOUT, "not Ready in 300s", retryable=True), ("Timeout", True)),
        (TransportError("connection refused"), ("Unreachable", True)),
        (SandboxGone("pod deleted"), ("SandboxGone", True)),
        (DaemonError(503, "busy", "overloaded"), ("Daemon503", True)),
        (DaemonError(401, "unauthorized", "bad token"), ("Daemon401", True)),
        (_api(500), ("Api500", True)),
        (_api(429), ("Api429", True)),
        (_api(403), ("Api403", False)),  # forbidden stays forbidden
        (ConnectionResetError(), ("ConnectionResetError", True)),
        (TimeoutError(), ("TimeoutError", True)),
    ],
)
def test_infrastructure_failures_are_classified(
    error: BaseException, want: tuple[str, bool]
) -> None:
    assert infra_failure(error) == want


@pytest.mark.parametrize(
    "error",
    [
        ValueError("the agent's bug"),
        AssertionError("wrong answer"),
        DaemonError(404, "not_found", "no such file"),  # the task asked for a missing file
        DaemonError(400, "bad_request", "bad argv"),
    ],
)
def test_task_errors_are_not_the_infrastructures(error: BaseException) -> None:
    assert infra_failure(error) is None


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "retry"),
    [
        (0, 3, True),  # attempts 0, 1, 2: two more to go
        (1, 3, True),
        (2, 3, False),  # the last one failed: give up
        (0, 1, False),  # a single attempt allowed
    ],
)
def test_retryable_failures_retry_until_the_attempts_run_out(
    attempt: int, max_attempts: int, retry: bool
) -> None:
    e = TransportError("connection refused")
    assert after_failure(e, True, attempt, max_attempts) == AfterFailure(retry, broken=False)


@pytest.mark.parametrize("reason", [E.IMAGE_NOT_FOUND, E.POLICY_DENIED, E.INVALID])
def test_a_start_error_every_sandbox_would_hit_breaks_the_problem(reason: str) -> None:
    e = E(reason, "will never start", retryable=False)
    assert after_failure(e, False, 0, 3) == AfterFailure(retry=False, broken=True)


def test_other_permanent_failures_give_up_without_breaking_the_problem() -> None:
    # a 403 on one pod says nothing about the problem's image
    assert after_failure(_api(403), False, 0, 3) == AfterFailure(retry=False, broken=False)
    e = E(E.IMAGE_NOT_FOUND, "manifest unknown", retryable=True)  # retryable: a registry blip
    assert after_failure(e, True, 0, 3) == AfterFailure(retry=True, broken=False)
