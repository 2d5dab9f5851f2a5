"""Whose fault a failed attempt was, and what the runner does next (pure).

A task ends in one of four states:

- ``pass`` / ``fail``: scored; the agent's output was applied and tested
  (a patch that does not apply, a test that fails or a task that runs out of
  time are the agent's failures and score 0);
- ``error``: the task itself is broken (its setup failed, its workdir does
  not exist); not scored and not retried: it would fail again;
- ``infra_failed``: the infrastructure failed every attempt it was given (a
  sandbox that never started, a daemon that died, a registry that did not
  answer); never scored.

Infrastructure failures go through the SDK's classifier
(``sandman.fleet.retry.infra_failure``: start errors with their
``retryable`` flag, unreachable daemons, daemon 5xx) plus the runner's own
(a moved tag, a condition the pod does not meet, an image that could not be
pinned); retryable ones get another attempt in a new sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandman.fleet.retry import infra_failure

PASS, FAIL, ERROR, INFRA = "pass", "fail", "error", "infra_failed"
SCORED = (PASS, FAIL)
# Between attempts: 2 s, 4 s, 8 s (at most 15 s), so that a node that lost
# a daemon or a registry that hiccuped has a moment; a benchmark's wall time
# is minutes, so this is noise next to a retried task's own run.
RETRY_BACKOFF_S = 2.0
RETRY_BACKOFF_MAX_S = 15.0


class EvalInfraError(Exception):
    """An infrastructure failure the runner itself detected."""

    reason = "Infrastructure"
    retryable = False

    def __init__(
        self, message: str, *, reason: str | None = None, retryable: bool | None = None
    ) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason
        if retryable is not None:
            self.retryable = retryable


class TagMoved(EvalInfraError):
    reason = "TagMoved"


class ConditionsNotMet(EvalInfraError):
    reason = "ConditionsNotMet"


class TaskBroken(Exception):
    """The task cannot run as specified (status ``error``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Failure:
    reason: str
    message: str
    retryable: bool


def classify(e: BaseException) -> Failure | None:
    """An infrastructure failure, or None when ``e`` is not one (a broken task)."""
    if isinstance(e, EvalInfraError):
        return Failure(e.reason, str(e), e.retryable)
    hit = infra_failure(e)
    if hit is None:
        return None
    reason, retryable = hit
    return Failure(reason, str(e) or type(e).__name__, retryable)


def retry(failure: Failure, attempt: int, max_attempts: int) -> bool:
    """Another attempt after ``attempt`` (1-based) failed with ``failure``?"""
    return failure.retryable and attempt < max_attempts


def retry_backoff_s(attempt: int) -> float:
    return float(min(RETRY_BACKOFF_S * 2 ** (attempt - 1), RETRY_BACKOFF_MAX_S))
