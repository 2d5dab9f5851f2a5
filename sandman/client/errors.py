"""Errors of the Sandman SDK.

    SandmanError
    ├── ClientClosed            the client was used after close()
    ├── SandboxStartError       a sandbox did not come up; ``reason`` and ``retryable``
    ├── SandboxGone             the sandbox's pod no longer exists (released, reclaimed)
    ├── TransportError          the daemon could not be reached (retryable)
    └── DaemonError             the daemon answered 4xx/5xx; ``status``, ``code``
        ├── Unauthorized        wrong or missing token (401)
        └── StreamAborted       the daemon cut a stream it had begun (a tar whose
                                files vanished or changed while it was made: retry)

``retryable`` on SandboxStartError separates infrastructure weather (no
capacity yet, a registry hiccup, a timeout: try again) from a sandbox that can
never start (the image does not exist, the policy forbids it): an RL loop must
count the first as an infrastructure failure to retry, never as a zero reward,
and must not retry the second forever.
"""

from __future__ import annotations


class SandmanError(Exception):
    pass


class ClientClosed(SandmanError):
    pass


class SandboxStartError(SandmanError):
    # Stable reasons (classification of what went wrong at start).
    IMAGE_NOT_FOUND = "ImageNotFound"
    IMAGE_PULL = "ImagePullFailed"
    UNSCHEDULABLE = "Unschedulable"
    POLICY_DENIED = "PolicyDenied"
    QUOTA = "QuotaExceeded"
    ADMISSION_UNAVAILABLE = "AdmissionUnavailable"
    CRASHED = "ContainerFailed"
    DELETED = "Deleted"
    TIMEOUT = "Timeout"
    INVALID = "Invalid"

    def __init__(self, reason: str, message: str, *, retryable: bool, pod: str = "") -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.retryable = retryable
        self.pod = pod


class SandboxGone(SandmanError):
    pass


class TransportError(SandmanError):
    retryable = True


class DaemonError(SandmanError):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class Unauthorized(DaemonError):
    pass


class StreamAborted(DaemonError):
    """The daemon began a streamed answer (HTTP 200) and then cut it, saying
    why in its last record: nothing of that answer is usable. ``status`` is the
    200 it had sent; ``code`` and ``message`` are the daemon's."""
