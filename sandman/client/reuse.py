"""May a used sandbox serve another rollout? (pure: a reset report and a pod in, a verdict out)

Two things must hold. The daemon's reset verified the sandbox against its
pristine record (``"clean": true``). And the record is the one the daemon
took at the sandbox's first start: a container that restarted
(``restartCount > 0``) runs a new daemon, which cannot tell a record the
agent deleted (it can SIGTERM PID 1 and remove ``/.sandman/pristine.rec``)
from a first start, and takes a new record of whatever it finds. Its
``clean: true`` then proves nothing (daemon/API.md, "Trust boundary").

Only the pod's containers count: init containers (the daemon's install
step, native sidecars) run no daemon of the sandbox.
"""

from __future__ import annotations

from typing import Any


def restarts(pod: dict[str, Any]) -> dict[str, int]:
    """Containers of the pod that have restarted, with their restart counts."""
    out: dict[str, int] = {}
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        n = int(cs.get("restartCount") or 0)
        if n > 0:
            out[str(cs.get("name", "?"))] = n
    return out


def restart_refusal(pod: dict[str, Any]) -> str | None:
    """Why a pod's restarts forbid reuse, or None when no container restarted."""
    counts = restarts(pod)
    if not counts:
        return None
    which = ", ".join(f"{name} x{n}" for name, n in sorted(counts.items()))
    return f"container restarted ({which}): its pristine record cannot be trusted"


def refusal(report: dict[str, Any], pod: dict[str, Any]) -> str | None:
    """Why a sandbox must be replaced instead of reused, or None to reuse it.

    ``report`` is the answer of ``/v1/reset``; ``pod`` MUST be read after that
    answer, so that a restart during the rollout or the reset is seen.
    """
    why = restart_refusal(pod)
    if why:
        return why
    if not report.get("clean"):
        drift = report.get("drift") or []
        return "reset found drift" + (f": {'; '.join(map(str, drift[:3]))}" if drift else "")
    return None
