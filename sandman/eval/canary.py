"""Are the offline NetworkPolicies enforced? A canary connection that must fail.

``network.ensure_offline`` proves the policies exist; only the cluster's
network plugin makes them hold, and one that does not enforce NetworkPolicy
(many CNIs do not) leaves "offline" tasks online. So the first offline
sandbox of a run tries a TCP connection, with a short timeout, to the
apiserver's ``kubernetes.default`` Service (``KUBERNETES_SERVICE_HOST``/
``_PORT``, set by the kubelet in every container of every cluster): reachable
from any pod without a policy, and refused by ``sandman-eval-offline-egress``
(``egress: []``). It runs with the daemon's own interpreter, so the image
needs no tools. The decision is ``verdict`` (pure); ``NetworkCheck`` runs the
canary once per run and shares the verdict.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sandman.contract import DAEMON_RUNTIME_DIR
from sandman.eval.decide import EvalInfraError

# 3 s: a blocked connection is a timeout (a dropping enforcer) or an
# immediate refusal (a rejecting one); an open path to a Service answers in
# milliseconds. The exec's own timeout leaves room for the interpreter start.
CONNECT_TIMEOUT_S = 3
EXEC_TIMEOUT_S = 15.0
ALLOW_FLAG = "--allow-unverified-network"

_CODE = f"""
import os, socket, sys
h, p = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
if not h or not p:
    print("no KUBERNETES_SERVICE_HOST/PORT in the sandbox"); sys.exit(3)
try:
    socket.create_connection((h, int(p)), {CONNECT_TIMEOUT_S}).close()
except OSError as e:
    print(f"{{h}}:{{p}} blocked: {{type(e).__name__}}: {{e}}"); sys.exit(1)
print(f"{{h}}:{{p}} connected"); sys.exit(0)
"""
ARGV = [DAEMON_RUNTIME_DIR + "/bin/sandmand", "-I", "-S", "-c", _CODE]


class Canary(enum.Enum):
    BLOCKED = "blocked"  # the connection failed: the policy is enforced
    CONNECTED = "connected"  # it went through: nothing enforces the policy
    NOT_RUN = "not_run"  # the canary could not run (no answer either way)


def canary_of(exit_code: int) -> Canary:
    return {0: Canary.CONNECTED, 1: Canary.BLOCKED}.get(exit_code, Canary.NOT_RUN)


class NetworkUnverified(EvalInfraError):
    """Offline tasks cannot be shown to be offline here (the run is refused)."""

    reason = "NetworkUnverified"


@dataclass(frozen=True)
class Verdict:
    network: str  # "verified" | "unverified"
    refusal: str | None  # the run's refusal message, if refused


def verdict(canary: Canary, detail: str, allow_unverified: bool) -> Verdict:
    """What a canary outcome means for the run (pure)."""
    if canary is Canary.BLOCKED:
        return Verdict("verified", None)
    if allow_unverified:
        return Verdict("unverified", None)
    if canary is Canary.CONNECTED:
        what = (
            "the offline sandbox reached the apiserver's kubernetes.default Service "
            f"({detail}) although sandman-eval-offline-egress allows no egress: nothing in "
            "this cluster enforces NetworkPolicy, so offline tasks would have network"
        )
    else:
        what = (
            f"the network canary could not run in the offline sandbox ({detail}), so "
            "whether offline tasks are offline is unknown"
        )
    return Verdict(
        "unverified",
        f"{what}; install a network plugin that enforces NetworkPolicy (e.g. Calico, "
        f"Cilium, kube-router), or pass {ALLOW_FLAG} to run and record network: unverified",
    )


RunCanary = Callable[[], Awaitable[tuple[int, str]]]


class NetworkCheck:
    """The run's one canary, shared by its offline attempts. Event-loop only.

    Prevents two failures: a run claiming "offline" on a cluster that does
    not enforce NetworkPolicy, and every offline sandbox paying for its own
    canary. The first offline attempt runs it; concurrent ones await that
    run. A canary that raised (the daemon went away) is not a verdict: the
    next offline attempt tries again.
    """

    def __init__(self, allow_unverified: bool) -> None:
        self.allow_unverified = allow_unverified
        self.record: dict[str, Any] = {"network": "not_checked"}
        self._done: Verdict | None = None
        self._running: asyncio.Future[Verdict] | None = None
        self._failed: str | None = None  # why the last canary could not answer

    def finish(self) -> None:
        """At the run's end: an offline sandbox started but no canary ever
        answered (every try failed: kwok nodes, a daemon never reachable) is
        "could not run", not "not checked"."""
        if self._done is None and self._failed is not None:
            self._decide(-1, self._failed)

    def refusal(self) -> str | None:
        return self._done.refusal if self._done is not None else None

    def raise_if_refused(self) -> None:
        if (why := self.refusal()) is not None:
            raise NetworkUnverified(why)

    async def verify(self, run: RunCanary) -> Verdict:
        if self._done is None:
            if self._running is None:
                self._running = asyncio.ensure_future(self._run(run))
            await asyncio.shield(self._running)
        assert self._done is not None
        self.raise_if_refused()
        return self._done

    async def _run(self, run: RunCanary) -> Verdict:
        try:
            code, out = await run()
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
            if not self.allow_unverified:
                # The attempt fails as infrastructure and is retried; the
                # next offline sandbox runs the canary again (see finish).
                self._failed = why
                raise
            code, out = -1, why  # the flag: unverified, and the task goes on
        finally:
            self._running = None
        return self._decide(code, out)

    def _decide(self, code: int, out: str) -> Verdict:
        c = canary_of(code)
        detail = out.strip()[:500] or f"exit {code}"
        self._done = verdict(c, detail, self.allow_unverified)
        self.record = {"network": self._done.network, "canary": c.value, "detail": detail}
        return self._done
