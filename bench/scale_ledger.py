"""The scale bench's own record of every pod and lease, and what counts as wrong (pure).

Two streams feed one ledger, both JSON lines with a wall-clock ``t``:

- ``src: bench``: what the bench did and was told: every create it sent
  (``create``: name, kind ``sandbox``/``bystander``, the answer's uid and
  ``expires`` = the admitted object's ``sandman.dev/expires-at``), every lease
  extension (``extend``: the new end, whether the apiserver applied it and
  whether the pod was already terminating then), every pod it deleted itself
  (``delete``, written before the call), chaos windows and phase marks;
- ``src: watch``: what a watch on the bench's namespaces saw: a pod's first
  sight (``seen``: sandbox label, daemon injected, policy defaults missing,
  ``expires``), its binding (``bound``), Ready (``ready``), a new
  ``expires`` value, the start of its deletion (``deleting``: the first
  ``deletionTimestamp``, a DELETED event, or absence from a relist).

A deletion is **wrong** when nobody may have made it: a pod that is not a
sandbox the bench leased (a bystander, or anything the bench never created),
or a sandbox whose deletion started before the latest end its lease is known
to have had (the largest of: the admitted expires-at, every extension the
apiserver applied to the live pod, every expires-at value the watch saw).
Deletions the bench made itself never count. Taking the largest known end
is the strict reading: an extension that reached the pod wins even if the
watch missed it.

One early deletion is not wrong but reported apart (``stuck_reclaims``): the
reaper's documented stuck rule, a sandbox never Ready for ``--stuck-pending``
(10 min by default) since its ``creationTimestamp``. It counts only when the
watch never saw the pod Ready and its deletion started at least that long
after the apiserver created it; anything earlier stays wrong.

The failure this guards against: a reaper bench that counts "deleted pods
whose annotation said expired" would miss a reaper that deleted a pod whose
lease had just been extended (the race the UID + resourceVersion
preconditions exist for), or a node eviction that took sandboxes early.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandman.contract import (
    ANN_ADMITTED,
    ANN_EXPIRES_AT,
    ANN_INJECTED,
    DAEMON_ARGV,
    DAEMON_INIT_CONTAINER,
    DAEMON_RUNTIME_DIR,
    DAEMON_SHARED_VOLUME,
    LABEL_ID,
    SCHEDULER_NAME,
    ContractError,
    is_sandbox,
    parse_time,
)

# Deletions observed this long before the lease end still count as wrong;
# 0: the watch stamps a deletion after it happened (never earlier), and the
# reaper, the bench and the watch read the same host clock.
EARLY_TOLERANCE_S = 0.0
# The reaper's --stuck-pending default (reaper/config.py), which every cluster
# the bench starts or deploys runs with.
STUCK_PENDING_S = 600.0


@dataclass
class PodRecord:
    """Everything known about one pod name in the bench's namespaces."""

    name: str
    kind: str = "unknown"  # sandbox | bystander | unknown (never created by the bench)
    uid: str = ""
    created_at: float | None = None  # the create call's answer
    create_sent_at: float | None = None
    create_attempts: int = 0
    create_code: int | None = None
    seen_at: float | None = None
    k8s_created_at: float | None = None  # metadata.creationTimestamp (1 s resolution)
    labeled: bool = False  # carries sandman.dev/sandbox=true as seen
    daemon: bool = False  # the init container and the daemon's command were injected
    missing: tuple[str, ...] = ()  # policy defaults absent when first seen
    lease_end: float | None = None  # the latest end known (see the module docstring)
    extensions: int = 0
    bound_at: float | None = None
    node: str = ""
    ready_at: float | None = None
    deleting_at: float | None = None
    deleted_by_bench: float | None = None

    def raise_lease(self, end: float | None) -> None:
        if end is not None and (self.lease_end is None or end > self.lease_end):
            self.lease_end = end


@dataclass(frozen=True)
class Wrong:
    name: str
    why: str  # not-a-sandbox | before-lease-end
    detail: str


@dataclass(frozen=True)
class Window:
    what: str
    start: float
    end: float


@dataclass
class Ledger:
    """Folds both streams into per-pod records. Not thread-safe (one reader)."""

    pods: dict[str, PodRecord] = field(default_factory=dict)
    chaos: list[Window] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    events: int = 0

    def pod(self, name: str) -> PodRecord:
        rec = self.pods.get(name)
        if rec is None:
            rec = self.pods[name] = PodRecord(name)
        return rec

    def apply(self, ev: dict[str, Any]) -> None:
        self.events += 1
        kind = ev.get("ev")
        if kind == "phase":
            self.phases[ev["name"]] = ev["t"]
            return
        if kind == "chaos":
            self.chaos.append(Window(ev["what"], ev["start"], ev["end"]))
            return
        if "name" not in ev:
            return
        rec = self.pod(ev["name"])
        if ev.get("src") == "bench":
            self._bench(rec, kind, ev)
        else:
            self._watch(rec, kind, ev)

    def _bench(self, rec: PodRecord, kind: str | None, ev: dict[str, Any]) -> None:
        if kind == "create":
            rec.kind = ev.get("kind", rec.kind)
            rec.create_sent_at = ev.get("t0", rec.create_sent_at)
            rec.create_attempts = int(ev.get("attempts", 1))
            rec.create_code = ev.get("code")
            if ev.get("uid"):
                rec.uid = ev["uid"]
                rec.created_at = ev["t"]
            rec.raise_lease(ev.get("expires"))
        elif kind == "extend":
            # Only an extension applied to a live pod moves its lease: one that
            # reached a pod already being deleted came too late to matter.
            if ev.get("ok") and not ev.get("terminating"):
                rec.raise_lease(ev.get("expires"))
                rec.extensions += 1
        elif kind == "delete" and rec.deleted_by_bench is None:
            rec.deleted_by_bench = ev["t"]

    def _watch(self, rec: PodRecord, kind: str | None, ev: dict[str, Any]) -> None:
        if kind == "seen":
            if rec.seen_at is None:
                rec.seen_at = ev["t"]
                rec.labeled = bool(ev.get("sandbox"))
                rec.daemon = bool(ev.get("daemon"))
                rec.missing = tuple(ev.get("missing") or ())
                rec.k8s_created_at = ev.get("created")
            if ev.get("uid") and not rec.uid:
                rec.uid = ev["uid"]
            rec.raise_lease(ev.get("expires"))
        elif kind == "expires":
            if rec.deleting_at is None:
                rec.raise_lease(ev.get("expires"))
        elif kind == "bound":
            if rec.bound_at is None:
                rec.bound_at, rec.node = ev["t"], ev.get("node", "")
        elif kind == "ready":
            if rec.ready_at is None:
                rec.ready_at = ev["t"]
        elif kind == "deleting" and rec.deleting_at is None:
            rec.deleting_at = ev["t"]

    def extend(self, events: Iterable[dict[str, Any]]) -> Ledger:
        for ev in events:
            self.apply(ev)
        return self

    # -- questions ----------------------------------------------------------------
    def sandboxes(self) -> Iterator[PodRecord]:
        return (r for r in self.pods.values() if r.kind == "sandbox")

    def count(self, pred: Any) -> int:
        return sum(1 for r in self.pods.values() if pred(r))


def expires_of(pod: dict[str, Any]) -> float | None:
    """The pod's ``sandman.dev/expires-at`` as epoch seconds, or None."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_EXPIRES_AT)
    if not value:
        return None
    try:
        return parse_time(value).timestamp()
    except ContractError:
        return None


def pod_facts(pod: dict[str, Any]) -> dict[str, Any]:
    """What the first sight of a pod records: is it a sandbox, does it carry the
    injected daemon, which of the policy defaults every sandbox gets are absent."""
    md = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    ann = md.get("annotations") or {}
    labels = md.get("labels") or {}
    sandbox = is_sandbox(pod)
    argv0 = DAEMON_ARGV[0]
    runs = [c for c in spec.get("containers") or () if (c.get("command") or [""])[0] == argv0]
    # Its tree comes from the install step, or (the "node" delivery) is the
    # node's copy mounted where the daemon runs from.
    placed = any(
        c.get("name") == DAEMON_INIT_CONTAINER for c in spec.get("initContainers") or ()
    ) or any(
        m.get("name") == DAEMON_SHARED_VOLUME and m.get("mountPath") == DAEMON_RUNTIME_DIR
        for c in runs
        for m in c.get("volumeMounts") or ()
    )
    daemon = bool(runs) and placed
    missing = []
    created = None
    with contextlib.suppress(KeyError, TypeError, ContractError):
        created = parse_time(md["creationTimestamp"]).timestamp()
    if sandbox:
        checks = {
            "injected": ANN_INJECTED in ann,
            "admitted": ANN_ADMITTED in ann,
            "expires-at": ANN_EXPIRES_AT in ann,
            "id": LABEL_ID in labels,
            "activeDeadlineSeconds": bool(spec.get("activeDeadlineSeconds")),
            "automountServiceAccountToken": spec.get("automountServiceAccountToken") is False,
            "enableServiceLinks": spec.get("enableServiceLinks") is False,
            "schedulerName": spec.get("schedulerName") == SCHEDULER_NAME,
        }
        missing = [k for k, ok in checks.items() if not ok]
    return {
        "uid": md.get("uid", ""),
        "sandbox": sandbox,
        "daemon": daemon,
        "missing": missing,
        "expires": expires_of(pod),
        "created": created,
    }


def stuck_reclaim(r: PodRecord, stuck_after_s: float = STUCK_PENDING_S) -> bool:
    """A sandbox the reaper's stuck rule may delete before its lease ended:
    never seen Ready, deleted at least ``stuck_after_s`` after its creation.
    ``creationTimestamp`` is truncated to the second, so the check is looser
    than the reaper's by under a second, never by more."""
    return (
        r.kind == "sandbox"
        and r.ready_at is None
        and r.deleting_at is not None
        and r.k8s_created_at is not None
        and r.deleting_at - r.k8s_created_at >= stuck_after_s
    )


def stuck_reclaims(ledger: Ledger, stuck_after_s: float = STUCK_PENDING_S) -> list[PodRecord]:
    """Sandboxes reclaimed by the stuck rule before their lease ended (not wrong)."""
    return [
        r
        for r in ledger.sandboxes()
        if r.deleted_by_bench is None
        and r.lease_end is not None
        and r.deleting_at is not None
        and r.deleting_at < r.lease_end
        and stuck_reclaim(r, stuck_after_s)
    ]


def wrong_deletions(
    ledger: Ledger,
    tolerance_s: float = EARLY_TOLERANCE_S,
    stuck_after_s: float = STUCK_PENDING_S,
) -> list[Wrong]:
    """Deletions nobody may have made (the bench's own and stuck reclaims excepted)."""
    out = []
    for r in ledger.pods.values():
        if r.deleting_at is None:
            continue
        if r.deleted_by_bench is not None and r.deleted_by_bench <= r.deleting_at:
            continue
        if stuck_reclaim(r, stuck_after_s):
            continue
        if r.kind != "sandbox":
            out.append(Wrong(r.name, "not-a-sandbox", f"a {r.kind} pod was deleted"))
        elif r.lease_end is None:
            out.append(Wrong(r.name, "before-lease-end", "deleted with no lease on record"))
        elif r.deleting_at < r.lease_end - tolerance_s:
            early = r.lease_end - r.deleting_at
            out.append(
                Wrong(r.name, "before-lease-end", f"deleted {early:.1f}s before its lease ended")
            )
    return out


def unreclaimed(ledger: Ledger, now: float, grace_s: float) -> list[PodRecord]:
    """Sandboxes whose lease ended more than ``grace_s`` before ``now`` and still exist."""
    return [
        r
        for r in ledger.sandboxes()
        if r.uid
        and r.deleting_at is None
        and r.deleted_by_bench is None
        and r.lease_end is not None
        and r.lease_end + grace_s < now
    ]


def without_daemon(ledger: Ledger) -> list[PodRecord]:
    """Pods seen with the sandbox label but without the daemon or a policy default."""
    return [r for r in ledger.pods.values() if r.labeled and (not r.daemon or r.missing)]


def reclaim_latencies(
    ledger: Ledger, since: float = 0.0, until: float = float("inf")
) -> list[float]:
    """Deletion start - lease end, for sandboxes whose lease ended in [since, until)
    and that something other than the bench deleted."""
    return [
        r.deleting_at - r.lease_end
        for r in ledger.sandboxes()
        if r.deleting_at is not None
        and r.lease_end is not None
        and r.deleted_by_bench is None
        and since <= r.lease_end < until
        and not (r.deleting_at < r.lease_end and stuck_reclaim(r))
    ]


def read_events(*paths: Path) -> list[dict[str, Any]]:
    """Every event of the given JSON-lines files, in time order (a torn last line,
    from a writer that was killed, is skipped)."""
    out: list[dict[str, Any]] = []
    for p in paths:
        if not p.exists():
            continue
        for line in p.read_text().splitlines():
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    out.sort(key=lambda e: e.get("t", 0.0))
    return out
