"""Why a sandbox is not coming up (pure: a pod, or an API error, in; a verdict out).

Fail fast is the point: a sandbox whose image does not exist should cost its
caller seconds, not a five-minute timeout, and be reported as not retryable;
one waiting for capacity should be reported as retryable.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sandman.client.errors import SandboxStartError as E

# Messages of a registry that has no such image (containerd and CRI wordings).
NOT_FOUND_HINTS = ("not found", "manifest unknown", "name unknown", "404", "does not exist")
FATAL_WAITING = {
    "InvalidImageName": E.INVALID,
    "CreateContainerConfigError": E.INVALID,
    "ErrImageNeverPull": E.IMAGE_NOT_FOUND,
}


def ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def daemon_may_answer(pod: dict[str, Any]) -> bool:
    """Whether the sandbox container may be running, so that asking its daemon
    directly is worth a request: the pod has an IP and every init container
    has ended (a native sidecar, ``restartPolicy: Always``: has started)."""
    st = pod.get("status") or {}
    if not st.get("podIP"):
        return False
    statuses = {s.get("name"): s for s in st.get("initContainerStatuses") or []}
    for c in (pod.get("spec") or {}).get("initContainers") or []:
        s = statuses.get(c.get("name"))
        if s is None:
            return False
        if c.get("restartPolicy") == "Always":
            if not s.get("started"):
                return False
        elif ((s.get("state") or {}).get("terminated") or {}).get("exitCode", 1) != 0:
            return False
    return True


def verdict(
    pod: dict[str, Any], *, waited: dt.timedelta, unschedulable_grace: dt.timedelta
) -> E | None:
    """A start failure to raise now, or None to keep waiting."""
    name = (pod.get("metadata") or {}).get("name", "")
    st = pod.get("status") or {}
    phase = st.get("phase")
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        # Someone deleted it (a reaper, a scale-down, a user): not the image's
        # fault, and a new pod may well start.
        return E(E.DELETED, "the pod is being deleted", retryable=True, pod=name)
    if phase in ("Failed", "Succeeded"):
        return E(
            E.CRASHED,
            f"the pod ended ({phase}): {st.get('reason', '')} {st.get('message', '')}".strip(),
            retryable=False,
            pod=name,
        )
    for cs in [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]:
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        reason, message = waiting.get("reason", ""), waiting.get("message", "")
        if reason in FATAL_WAITING:
            return E(
                FATAL_WAITING[reason],
                f"{cs.get('name')}: {reason}: {message}",
                retryable=False,
                pod=name,
            )
        if reason in ("ErrImagePull", "ImagePullBackOff"):
            if any(h in message.lower() for h in NOT_FOUND_HINTS):
                return E(
                    E.IMAGE_NOT_FOUND,
                    f"{cs.get('name')}: image {cs.get('image')}: {message}",
                    retryable=False,
                    pod=name,
                )
            return E(E.IMAGE_PULL, f"{cs.get('name')}: {message}", retryable=True, pod=name)
        if reason == "CrashLoopBackOff":
            return E(
                E.CRASHED, f"{cs.get('name')} keeps crashing: {message}", retryable=False, pod=name
            )
        terminated = state.get("terminated") or {}
        if cs.get("name") == "sandman-install" and terminated.get("exitCode", 0) != 0:
            return E(
                E.CRASHED,
                f"daemon install failed: {terminated.get('message', '')}",
                retryable=False,
                pod=name,
            )
    for c in st.get("conditions") or []:
        if (
            c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
            and waited >= unschedulable_grace
        ):
            return E(E.UNSCHEDULABLE, c.get("message", "no node fits"), retryable=True, pod=name)
    return None


def admission_error(status: int, body: Any) -> E:
    """Classify a failed pod create (the webhook's message is kept whole)."""
    message = body.get("message", "") if isinstance(body, dict) else str(body)
    if status == 403 and "exceeded quota" in message:
        return E(E.QUOTA, message, retryable=True)
    if status == 403 and "denied the request" in message:
        return E(E.POLICY_DENIED, message, retryable=False)
    if status == 500 and "failed calling webhook" in message:
        return E(E.ADMISSION_UNAVAILABLE, message, retryable=True)
    if status in (400, 422):
        return E(E.INVALID, message, retryable=False)
    if status == 403:
        # RBAC (no create on pods here), or another admission plugin's refusal:
        # never reported as Sandman's policy, whose denials name the webhook.
        return E(E.FORBIDDEN, message, retryable=False)
    return E(E.ADMISSION_UNAVAILABLE, f"HTTP {status}: {message}", retryable=status >= 500)
