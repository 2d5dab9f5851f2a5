"""Errors of the Sandman SDK: every exception it raises is a SandmanError.

    SandmanError
    ├── ConfigError             no usable kubeconfig (also a KubeconfigError)
    ├── ClientClosed            the client was used after close()
    ├── SandboxStartError       a sandbox did not come up; ``reason`` and ``retryable``
    ├── SandboxGone             the sandbox's pod no longer exists (released, reclaimed)
    ├── KubernetesError         the apiserver refused a request (403, 409, 5xx...);
    │                           ``status``, ``reason``, ``body`` (also an ApiError)
    ├── WaitTimeout             a wait the caller bounded ran out (also a TimeoutError)
    ├── TransportError          the daemon or the apiserver could not be reached, or
    │                           the connection broke off (retryable; also a ConnectionError)
    └── DaemonError             the daemon answered 4xx/5xx; ``status``, ``code``
        ├── Unauthorized        wrong or missing token (401)
        ├── StreamAborted       the daemon cut a stream it had begun (a tar whose
        │                       files vanished or changed while it was made: retry)
        ├── ResponseTooLarge    the answer is over the call's ``max_bytes``; nothing
        │                       past the bound was read (raise it, or stream)
        └── ProtocolError       the answer is not what the daemon's API says (not
                                JSON, nested past the parser's depth, fields missing)

``retryable`` on SandboxStartError separates infrastructure weather (no
capacity yet, a registry hiccup, a timeout: try again) from a sandbox that can
never start (the image does not exist, the policy forbids it): an RL loop must
count the first as an infrastructure failure to retry, never as a zero reward,
and must not retry the second forever.

What a daemon answers is written inside the sandbox, where the agent may have
replaced the daemon: every answer is read up to a bound (ResponseTooLarge past
it) and every malformed one is a ProtocolError, never an exception of the
JSON parser or an out-of-memory trainer.

Errors of the libraries underneath (aiohttp's connection errors, asyncio's
timeouts, the apiserver's refusals) are translated where the SDK calls them
(``sandman.client.edges``), the original chained as ``__cause__``. The two
that other code already catches stay catchable as before: KubernetesError is
an ``ApiError``, ConfigError a ``KubeconfigError``, TransportError a
``ConnectionError`` (an OSError, as aiohttp's connection errors are).
"""

from __future__ import annotations

from typing import Any

from sandman.kube_async import ApiError, KubeconfigError


class SandmanError(Exception):
    pass


class ConfigError(SandmanError, KubeconfigError):
    """No usable cluster configuration (kubeconfig, context, credentials); the
    message names the file, context or plugin and what to do."""


class ClientClosed(SandmanError):
    pass


class SandboxStartError(SandmanError):
    # Stable reasons (classification of what went wrong at start).
    IMAGE_NOT_FOUND = "ImageNotFound"
    IMAGE_PULL = "ImagePullFailed"
    UNSCHEDULABLE = "Unschedulable"
    POLICY_DENIED = "PolicyDenied"
    # Kubernetes RBAC refused the create: a permission, not Sandman's policy.
    FORBIDDEN = "Forbidden"
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


class KubernetesError(SandmanError, ApiError):
    """The apiserver answered a request with an error the SDK does not turn
    into something more specific: 403 (RBAC: ask for the sandman-user role in
    the namespace), 409, 422, a 5xx after the retries Retry-After allows.
    ``status``, ``reason`` and ``body`` (the Kubernetes Status) as ApiError."""

    def __init__(self, status: int, body: Any) -> None:
        ApiError.__init__(self, status, body)

    @property
    def retryable(self) -> bool:
        return self.status >= 500 or self.status == 429


class WaitTimeout(SandmanError, TimeoutError):
    """A wait bounded by the caller (``wait_pod(timeout_s=...)``) ran out
    before its condition held. Also a TimeoutError."""


class TransportError(SandmanError, ConnectionError):
    """The daemon or the apiserver could not be reached, the connection broke
    off, or an answer was cut short or never came: try again (another
    sandbox, if it keeps failing). Also a ConnectionError, so code that
    caught the connection errors of the libraries underneath (OSError)
    still catches it."""

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


class ResponseTooLarge(DaemonError):
    """The daemon's answer is larger than the caller's bound (``limit`` bytes).

    Reading stopped at the bound, so the trainer holds at most ``limit`` bytes
    of it. ``status`` is the answer's HTTP status; ``code`` is
    ``response_too_large``.
    """

    def __init__(self, status: int, limit: int, what: str, remedy: str) -> None:
        super().__init__(
            status,
            "response_too_large",
            f"{what}: the answer is over {limit} bytes, the bound of this call; {remedy}",
        )
        self.limit = limit


class ProtocolError(DaemonError):
    """The daemon's answer breaks its API: not JSON, JSON nested deeper than the
    parser goes, or a document without the fields the call needs. A real daemon
    never answers so; the agent may have replaced it. ``code`` is
    ``bad_answer``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, "bad_answer", message)
