"""Whose fault, and what next, when a rollout's attempt fails (pure).

A result is either valid (the task ran) or an infrastructure failure after
retries: no infrastructure error ever turns into a zero reward, and a task's
own error is never retried as if the sandbox were to blame.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandman.client.errors import DaemonError, SandboxGone, SandboxStartError, TransportError
from sandman.kube_async import ApiError

# Start failures that every sandbox of the problem would hit: later rollouts
# of the problem fail at once (reported, never dropped) instead of each
# paying the same failed start.
BROKEN_REASONS = frozenset(
    {
        SandboxStartError.IMAGE_NOT_FOUND,
        SandboxStartError.POLICY_DENIED,
        SandboxStartError.FORBIDDEN,
        SandboxStartError.INVALID,
    }
)


def infra_failure(e: BaseException) -> tuple[str, bool] | None:
    """(reason, retryable) if ``e`` is the infrastructure's fault, else None."""
    if isinstance(e, SandboxStartError):
        return e.reason, e.retryable
    if isinstance(e, TransportError):
        return "Unreachable", True
    if isinstance(e, SandboxGone):
        return "SandboxGone", True
    if isinstance(e, DaemonError) and (e.status >= 500 or e.status == 401):
        return f"Daemon{e.status}", True
    if isinstance(e, ApiError):
        return f"Api{e.status}", e.status >= 500 or e.status == 429
    if isinstance(e, (OSError, TimeoutError)):
        return type(e).__name__, True
    return None


@dataclass(frozen=True)
class AfterFailure:
    retry: bool  # another attempt with a new sandbox (with reuse: a new reservation)
    broken: bool  # the problem's other rollouts fail at once: its image can never start


def after_failure(
    e: BaseException, retryable: bool, attempt: int, max_attempts: int
) -> AfterFailure:
    """After attempt number ``attempt`` (0-based) failed with infrastructure error ``e``."""
    if not retryable:
        broken = isinstance(e, SandboxStartError) and e.reason in BROKEN_REASONS
        return AfterFailure(retry=False, broken=broken)
    return AfterFailure(retry=attempt + 1 < max_attempts, broken=False)
