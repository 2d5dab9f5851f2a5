"""Where a run's sandboxes can go, decided before any of them is created (pure).

Dedicated nodes are the recommendation: a task that shares its node with
other workloads gets noisy CPU, memory bandwidth and disk, and its timings
(and timeouts) move with them. A node is dedicated to profile ``P`` when it
is labelled ``sandman.dev/dedicated=P`` (so the runner can pin sandboxes to
it) and tainted ``sandman.dev/dedicated=P:NoSchedule`` (so nothing else lands
there; the webhook's ``dedicated-nodes`` rule keeps sandboxes of other
profiles from tolerating the taint).

The webhook stays the authority on placement: the profile's ``nodeSelector``
and ``tolerations`` are what the admin allows, learnt here from a
server-side dry run of a task's pod (the webhook's answer, not a copy of the
policy the runner may not even be allowed to read). The runner only narrows
it: when dedicated nodes exist it adds ``sandman.dev/dedicated=P`` to every
pod's nodeSelector (which the webhook merges with the profile's and checks
like any other), and it never removes what the profile requires. So a
profile that requires dedicated nodes (a ``nodeSelector`` on the label) keeps
requiring them: with none, the run is refused up front with the commands
that make one, instead of every task timing out Unschedulable. The shipped
``eval`` profile only tolerates the taint, so that a fresh install, which
has no dedicated node, can still run, on shared nodes, with that recorded.

``decide`` takes the placements the webhook gave (one per distinct task
size), the nodes (None when the runner may not list them) and whether the
user requires dedicated nodes, and returns a ``Preflight``: ``dedicated``
(pin to them), ``shared`` (run where the profile places pods, recording
the reason) or ``refused`` (nothing can run as asked; the message says
which condition fails and how to meet it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sandman.quantity import parse_quantity

DEDICATED_KEY = "sandman.dev/dedicated"
# Taint effects that keep a pod without the toleration off a node
# (PreferNoSchedule only discourages).
BLOCKING = ("NoSchedule", "NoExecute")
RESOURCES = ("cpu", "memory")
REQUIRE_FLAG = "--require-dedicated"
SKIP_FLAG = "--skip-node-check"
DEDICATED, SHARED, UNKNOWN, REFUSED = "dedicated", "shared", "unknown", "refused"
# Nodes named in a message before "and N more": enough to see the pattern.
NAMED_NODES = 5


@dataclass(frozen=True)
class Placement:
    """What the webhook gave one task pod: its selector, tolerations and size."""

    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    requests: Mapping[str, Decimal]  # the pod's effective cpu/memory requests

    @classmethod
    def of_pod(cls, pod: Mapping[str, Any]) -> Placement:
        spec = pod.get("spec") or {}
        return cls(
            dict(spec.get("nodeSelector") or {}),
            tuple(dict(t) for t in spec.get("tolerations") or []),
            pod_requests(pod),
        )


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...]
    allocatable: Mapping[str, Decimal]
    ready: bool
    cordoned: bool

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> Node:
        md, spec = node.get("metadata") or {}, node.get("spec") or {}
        status = node.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        return cls(
            str(md.get("name")),
            dict(md.get("labels") or {}),
            tuple(dict(t) for t in spec.get("taints") or []),
            _quantities(status.get("allocatable")),  # one not reported is not counted
            ready,
            bool(spec.get("unschedulable")),
        )


@dataclass(frozen=True)
class Preflight:
    verdict: str  # dedicated | shared | unknown | refused
    profile: str
    pin: Mapping[str, str] = field(default_factory=dict)  # added to every pod's nodeSelector
    reason: str = ""  # why not on dedicated nodes, why refused, or what was not checked
    fix: str = ""  # how to get dedicated nodes (or to run at all)
    nodes: tuple[str, ...] = ()  # where the tasks can run

    @property
    def dedicated(self) -> bool | None:
        return {DEDICATED: True, SHARED: False}.get(self.verdict)

    def message(self) -> str:
        return f"{self.reason}; {self.fix}" if self.fix else self.reason

    def record(self) -> dict[str, Any]:
        """For run.json and each task's conditions."""
        return {
            "dedicated_nodes": self.dedicated,
            "verdict": self.verdict,
            "label": label(self.profile),
            "pinned": dict(self.pin),
            "nodes": list(self.nodes),
            "reason": self.reason,
            "fix": self.fix,
        }


def label(profile: str) -> str:
    return f"{DEDICATED_KEY}={profile}"


def taint(profile: str) -> dict[str, str]:
    return {"key": DEDICATED_KEY, "value": profile, "effect": "NoSchedule"}


def setup_commands(profile: str, node: str = "NODE") -> str:
    return (
        f"kubectl label node {node} {label(profile)} && "
        f"kubectl taint node {node} {label(profile)}:NoSchedule"
    )


# -- the pod's size -------------------------------------------------------------------
def _quantities(m: Mapping[str, Any] | None) -> dict[str, Decimal]:
    """cpu and memory of a resource list (absent or unreadable ones left out)."""
    out = {}
    for r in RESOURCES:
        if r in (m or {}):
            try:
                out[r] = parse_quantity(str(m[r]))  # type: ignore[index]
            except ValueError:
                continue
    return out


def _container_requests(c: Mapping[str, Any]) -> dict[str, Decimal]:
    res = c.get("resources") or {}
    # A request left out defaults to the limit (the API server's defaulting).
    return _quantities({**(res.get("limits") or {}), **(res.get("requests") or {})})


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """What the scheduler reserves for the pod: the containers (and sidecar
    init containers, which keep running) summed, at least each ordinary init
    container (they run one at a time, before), plus the runtime's overhead."""
    spec = pod.get("spec") or {}
    total = {r: Decimal(0) for r in RESOURCES}
    inits = []
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            for r, q in _container_requests(c).items():
                total[r] += q
        else:
            inits.append(_container_requests(c))
    for c in spec.get("containers") or []:
        for r, q in _container_requests(c).items():
            total[r] += q
    for init in inits:
        for r, q in init.items():
            total[r] = max(total[r], q)
    for r, q in _quantities(spec.get("overhead")).items():
        total[r] += q
    return {r: q for r, q in total.items() if q > 0}


# -- one node against one placement ---------------------------------------------------------
def tolerated(taint_: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Kubernetes' ToleratesTaint for one taint and a pod's tolerations."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint_.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t.get("key") != taint_.get("key"):
            continue
        if op == "Exists" or str(t.get("value") or "") == str(taint_.get("value") or ""):
            return True
    return False


def _taint_text(t: Mapping[str, Any]) -> str:
    value = f"={t['value']}" if t.get("value") else ""
    return f"{t.get('key')}{value}:{t.get('effect')}"


def _quantity(r: str, q: Decimal) -> str:
    if r == "memory":
        return f"{q / 2**20:.0f}Mi"
    return f"{q.normalize():f}"


def blockers(node: Node, p: Placement) -> list[str]:
    """Why a pod placed as ``p`` can never run on ``node`` (empty: it can)."""
    out = []
    if not node.ready:
        out.append("not Ready")
    if node.cordoned:
        out.append("cordoned")
    for k, v in sorted(p.node_selector.items()):
        if node.labels.get(k) != v:
            out.append(f"not labelled {k}={v} (the profile's nodeSelector)")
    for t in node.taints:
        if t.get("effect") in BLOCKING and not tolerated(t, p.tolerations):
            out.append(f"tainted {_taint_text(t)}, which the profile does not tolerate")
    for r, q in sorted(p.requests.items()):
        have = node.allocatable.get(r)
        if have is not None and have < q:
            out.append(
                f"allocatable {r} {_quantity(r, have)} is less than a task pod's {_quantity(r, q)}"
            )
    return out


def dedication_gaps(node: Node, profile: str) -> list[str]:
    """What keeps ``node`` from being dedicated to ``profile`` (empty: dedicated)."""
    out = []
    if node.labels.get(DEDICATED_KEY) != profile:
        out.append(f"not labelled {label(profile)}")
    want = taint(profile)
    if not any(
        t.get("key") == DEDICATED_KEY and t.get("value") == profile and t.get("effect") in BLOCKING
        for t in node.taints
    ):
        out.append(f"not tainted {_taint_text(want)} (other pods can share it)")
    return out


def _listing(items: Sequence[str]) -> str:
    shown = "; ".join(items[:NAMED_NODES])
    more = len(items) - NAMED_NODES
    return shown + (f"; and {more} more" if more > 0 else "")


# -- the run ----------------------------------------------------------------------------
def decide(
    profile: str,
    placements: Sequence[Placement],
    nodes: Sequence[Node] | None,
    *,
    require_dedicated: bool = False,
    nodes_error: str = "",
) -> Preflight:
    """The run's placement, before any pod exists.

    ``placements``: what the webhook gave each distinct task pod (empty when
    it admitted none of them: those tasks fail on their own, per task).
    ``nodes``: the cluster's nodes, None when they were not listed
    (``nodes_error`` says why).
    """
    lbl = label(profile)
    if not placements:
        return Preflight(UNKNOWN, profile, reason="the webhook admitted no task pod to look at")
    pinned_by_profile = all(p.node_selector.get(DEDICATED_KEY) == profile for p in placements)
    if nodes is None:
        # Not looked at: not allowed to, or told not to (an autoscaler adds the
        # nodes once pods ask for them). Only a nodeSelector can promise the
        # label then; each task's node is checked when it starts.
        why = f"the nodes were not checked ({nodes_error or 'not listed'})"
        if pinned_by_profile or require_dedicated:
            pin = {} if pinned_by_profile else {DEDICATED_KEY: profile}
            note = f"{why}: the pods require {lbl}; each task's node is checked as it starts"
            return Preflight(DEDICATED, profile, pin=pin, reason=note)
        return Preflight(
            UNKNOWN,
            profile,
            reason=f"{why}: whether the tasks get dedicated nodes is known as each starts",
            fix="let the runner list nodes (nodes get, list) to decide before the run",
        )
    eligible = [[n for n in nodes if not blockers(n, p)] for p in placements]
    dedicated = [[n for n in ns if not dedication_gaps(n, profile)] for ns in eligible]
    if all(dedicated):
        names = sorted({n.name for ns in dedicated for n in ns})
        pin = {} if pinned_by_profile else {DEDICATED_KEY: profile}
        return Preflight(DEDICATED, profile, pin=pin, nodes=tuple(names))

    # Which placement lacks them, and what each candidate node lacks.
    i = next(i for i, ns in enumerate(dedicated) if not ns)
    p = placements[i]
    labelled = [n for n in nodes if n.labels.get(DEDICATED_KEY) == profile]
    if labelled:
        gaps = [
            f"{n.name}: {', '.join(dedication_gaps(n, profile) + blockers(n, p))}" for n in labelled
        ]
        reason = f"no node is dedicated to profile {profile!r}: {_listing(gaps)}"
    else:
        reason = f"no node is labelled {lbl} (dedicated to profile {profile!r})"
    # The node to name in the commands: the closest to dedicated first.
    near = [n for n in eligible[i] if n in labelled] + eligible[i] + labelled + list(nodes)
    example = near[0] if near else None
    fix = f"to dedicate a node: {setup_commands(profile, example.name if example else 'NODE')}"
    if not tolerated(taint(profile), p.tolerations):
        fix += (
            f", and give profile {profile!r} the toleration {taint(profile)} in the policy "
            "(docs/policy.md)"
        )
    if all(eligible) and not require_dedicated:
        names = sorted({n.name for ns in eligible for n in ns})
        return Preflight(SHARED, profile, reason=reason, fix=fix, nodes=tuple(names))
    if all(eligible):  # required by the user
        return Preflight(
            REFUSED, profile, reason=f"{REQUIRE_FLAG}: {reason}", fix=fix + f", or run without "
            f"{REQUIRE_FLAG} (on shared nodes, recorded as such)",
        )  # fmt: skip

    # Nothing can run where the profile places pods.
    j = next(j for j, ns in enumerate(eligible) if not ns)
    p = placements[j]
    if not nodes:
        return Preflight(REFUSED, profile, reason="the cluster has no nodes", fix=fix)
    why = [f"{n.name}: {', '.join(blockers(n, p))}" for n in nodes]
    reason = f"no node can run the tasks' pods of profile {profile!r}: {_listing(why)}"
    if p.node_selector.get(DEDICATED_KEY) == profile:
        fix += (
            f"; or, to run on shared nodes, remove nodeSelector {DEDICATED_KEY} from "
            f"profile {profile!r} in the policy"
        )
    else:
        fix = "make a node match the profile's nodeSelector and tolerations (docs/policy.md)"
    return Preflight(REFUSED, profile, reason=reason, fix=fix)


class PlacementRefused(Exception):
    """The run cannot be placed as asked; the message says why and how to fix it."""
