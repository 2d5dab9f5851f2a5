"""The image index: which node holds or is pulling which image (pure, bounded).

Fed by events (node reports, pod reports, the extender's own assumptions),
asked per pod for the facts ``score`` turns into numbers. No I/O, no client;
the clock is injected.
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from sandman.extender.limits import IndexLimits
from sandman.extender.names import ImageNames
from sandman.extender.observe import NodeReport, PodReport
from sandman.extender.refs import ImageRef, try_parse
from sandman.extender.score import EMPTY, NodeFacts

Clock = Callable[[], float]  # seconds, monotonic


@dataclass
class _Node:
    fingerprint: int = 0  # of the last report, to skip unchanged ones cheaply
    reported: dict[str, int] = field(default_factory=dict)  # key -> size
    truncated: bool = False
    smallest: int = 0  # smallest reported size (meaningful when truncated)
    observed: set[str] = field(default_factory=set)  # keys with a live observation
    running: Counter[str] = field(default_factory=Counter)  # keys of started containers


@dataclass(frozen=True)
class _Pod:
    node: str
    running: tuple[str, ...]  # keys (may repeat)
    pending: tuple[str, ...]  # idents (may repeat)
    crowd: frozenset[str]  # idents of every container, for the crowd count
    assumed: bool


@dataclass(frozen=True)
class Need:
    """One distinct image a pod needs, as the index resolved it."""

    ref: ImageRef
    size: int
    size_known: bool


@dataclass(frozen=True)
class PodFacts:
    needs: tuple[Need, ...]
    total: int
    facts: dict[str, NodeFacts]  # only nodes that differ from `default`
    primary: str  # ident of the largest image: the crowd counts it, ties break on it
    default: NodeFacts = EMPTY  # of every node not in `facts`


@dataclass(frozen=True)
class Where:
    """Which nodes hold or pull one image (the /v1/images answer)."""

    key: str
    size: int | None
    holders: dict[str, tuple[str, ...]]  # node -> evidence ("reported", "running", "observed")
    pulling: dict[str, int]  # node -> pods waiting for it there


@dataclass(frozen=True)
class IndexStats:
    nodes: int
    image_names: int
    entries: int  # (node, image key) pairs held
    pods: int
    assumed: int


class ImageIndex:
    """Which node holds or is pulling which image, from watches and observations.

    It exists because kube-scheduler's ImageLocality is blind here (design
    section 7): kubelets list only their 50 largest images, short names never
    match the kubelet's fully-qualified ones, and a pull in progress is
    invisible, so the 4 rollouts of a new task image land on 4 nodes and pull
    it 4 times. Prior art: the scheduler's own cache joins node status with
    assumed pods (pkg/scheduler/backend/cache, AssumePod/FinishBinding); this
    index does the same for images, keyed by normalised references.

    Failure modes it guards against: unbounded growth (every table is capped
    or expires), stale credit (observations expire, and a node's untruncated
    list refutes them after REPORT_LAG_S), and the binding race (a pod's
    assumed placement stands in until the watch shows the real one, then is
    replaced by pod UID).

    Not safe for concurrent use: one event loop feeds and queries it.
    """

    def __init__(self, *, clock: Clock, limits: IndexLimits | None = None) -> None:
        self._clock = clock
        self.limits = limits or IndexLimits()
        self._names = ImageNames(self.limits.max_image_names)
        self._nodes: dict[str, _Node] = {}
        self._holders: dict[str, set[str]] = {}  # key -> nodes holding it
        self._pending_by: dict[str, Counter[str]] = {}  # ident -> node -> pending containers
        self._crowd_by: dict[str, Counter[str]] = {}  # ident -> node -> active pods
        self._pods: dict[str, _Pod] = {}
        self._observed: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._assumed: OrderedDict[str, float] = OrderedDict()  # uid -> expiry
        # (when, node): a node whose list left an observation unrefuted only
        # because it was too recent. A kubelet posts its status only when it
        # changes (every 5 min otherwise), so the same list is re-applied here
        # once the lag has passed, as if it had been posted again.
        self._recheck: list[tuple[float, str]] = []

    def size_of(self, ref: ImageRef) -> int | None:
        return self._names.size_of(ref)

    # -- holders -------------------------------------------------------------
    def _node(self, name: str) -> _Node:
        rec = self._nodes.get(name)
        if rec is None:
            rec = self._nodes[name] = _Node()
        return rec

    def _refresh(self, node: str, key: str) -> None:
        rec = self._nodes.get(node)
        held = rec is not None and (
            key in rec.reported or key in rec.observed or rec.running[key] > 0
        )
        nodes = self._holders.get(key)
        if held:
            if nodes is None:
                nodes = self._holders[key] = set()
            nodes.add(node)
        elif nodes is not None:
            nodes.discard(node)
            if not nodes:
                del self._holders[key]

    def _observe(self, node: str, key: str, now: float) -> None:
        self._observed[(node, key)] = now
        self._observed.move_to_end((node, key))
        self._node(node).observed.add(key)
        self._refresh(node, key)
        if len(self._observed) > self.limits.max_observations:
            (old_node, old_key), _ = self._observed.popitem(last=False)
            self._forget_observation(old_node, old_key)

    def _forget_observation(self, node: str, key: str) -> None:
        self._observed.pop((node, key), None)
        rec = self._nodes.get(node)
        if rec is not None:
            rec.observed.discard(key)
        self._refresh(node, key)

    def _expire(self) -> float:
        now = self._clock()
        ttl = self.limits.observed_ttl_s
        while self._observed:
            (node, key), seen = next(iter(self._observed.items()))
            if seen + ttl > now:
                break
            self._forget_observation(node, key)
        while self._assumed:
            uid, expiry = next(iter(self._assumed.items()))
            if expiry > now:
                break
            self.remove_pod(uid)
        while self._recheck and self._recheck[0][0] <= now:
            _, node = heapq.heappop(self._recheck)
            rec = self._nodes.get(node)
            # Only a list that names images (a kubelet's; kwok nodes list
            # none) is evidence worth re-applying (_invalidate queues no other).
            if rec is not None and rec.reported:
                self._invalidate(node, rec, now)
        return now

    # -- nodes ---------------------------------------------------------------
    def update_node(self, report: NodeReport) -> None:
        """A node's ``status.images``: replaces what it reported before."""
        now = self._expire()
        rec = self._node(report.node)
        # Kubelets repeat the same list every status update: then only time
        # moved. A hash, not the entries, is kept: at 5,000 nodes x 50 images
        # the entries would be half a million objects for the GC to scan.
        fingerprint = hash(tuple((e.names, e.size) for e in report.entries))
        if rec.fingerprint == fingerprint and report.entries:
            self._invalidate(report.node, rec, now)
            return
        rec.fingerprint = fingerprint
        max_images = self.limits.node_status_max_images
        entries = report.entries[: self.limits.max_reported_per_node]
        reported: dict[str, int] = {}
        for entry in entries:
            refs = [r for r in map(try_parse, entry.names) if r is not None]
            digests = {r.digest for r in refs if r.digest}
            # One entry is one image: its tags name the digest it lists.
            digest = digests.pop() if len(digests) == 1 else None
            for r in refs:
                self._names.learn(r.key, size=entry.size, digest=None if r.digest else digest)
                for k in self._names.index_keys(r):
                    reported[k] = entry.size
                if r.content_key:
                    self._names.learn(r.content_key, size=entry.size)
        old = rec.reported
        rec.reported = reported
        rec.truncated = 0 <= max_images <= len(report.entries)
        rec.smallest = min((e.size for e in entries), default=0)
        for k in old.keys() ^ reported.keys():
            self._refresh(report.node, k)
        self._invalidate(report.node, rec, now)

    def _invalidate(self, node: str, rec: _Node, now: float) -> None:
        """Drop observations the node's own list refutes (see REPORT_LAG_S)."""
        recheck = None
        for key in list(rec.observed):
            if key in rec.reported or rec.running[key] > 0:
                continue
            due = self._observed.get((node, key), now) + self.limits.report_lag_s
            if due > now:  # too recent to be in the list yet
                recheck = due if recheck is None else min(recheck, due)
                continue
            if rec.truncated:
                size = self._names.size(key)
                # Sorted largest first: only a bigger image's absence proves it gone.
                if size is None or size <= rec.smallest:
                    continue
            self._forget_observation(node, key)
        if recheck is not None and rec.reported:
            heapq.heappush(self._recheck, (recheck, node))

    def remove_node(self, name: str) -> None:
        self._expire()
        rec = self._nodes.pop(name, None)
        if rec is None:
            return
        for key in list(rec.observed):
            self._observed.pop((name, key), None)
        for key in {*rec.reported, *rec.observed, *rec.running}:
            self._refresh(name, key)

    # -- pods ----------------------------------------------------------------
    def update_pod(self, report: PodReport) -> None:
        """A bound pod as the watch shows it; replaces any earlier or assumed record."""
        now = self._expire()
        running: list[str] = []
        pending: list[str] = []
        crowd: set[str] = set()
        for c in report.images:
            ref = try_parse(c.ref)
            if ref is None:
                continue
            crowd.add(ref.ident)
            if c.state == "started":
                keys = list(self._names.index_keys(ref))
                ran = try_parse(c.image_id)
                if ran is not None and ran.digest:
                    if not ref.digest:
                        self._names.learn(ref.key, digest=ran.digest)
                    keys += self._names.index_keys(ran)
                running += keys
                for k in keys:
                    self._observe(report.node, k, now)
            elif c.state == "pending":
                pending.append(ref.ident)
        self._set_pod(
            report.uid,
            _Pod(
                report.node,
                tuple(running),
                tuple(pending),
                frozenset(crowd) if report.active else frozenset(),
                assumed=False,
            ),
        )

    def assume(self, uid: str, node: str, refs: Iterable[str]) -> None:
        """Our predicted placement of a pod being scheduled, until the watch has it."""
        now = self._expire()
        current = self._pods.get(uid)
        if not uid or (current is not None and not current.assumed):
            return  # the watch already knows better
        idents = tuple(r.ident for r in map(try_parse, refs) if r is not None)
        self._set_pod(uid, _Pod(node, (), idents, frozenset(idents), assumed=True))
        self._assumed[uid] = now + self.limits.assume_ttl_s
        self._assumed.move_to_end(uid)

    def remove_pod(self, uid: str) -> None:
        """The pod is gone; what it started stays observed on its node (from now)."""
        old = self._pods.get(uid)
        self._set_pod(uid, None)
        if old is not None and old.running and old.node in self._nodes:
            now = self._clock()
            for key in set(old.running):
                self._observe(old.node, key, now)

    def _set_pod(self, uid: str, pod: _Pod | None) -> None:
        old = self._pods.pop(uid, None)
        if old is not None:
            self._apply(old, -1)
            if old.assumed:
                self._assumed.pop(uid, None)
        if pod is not None:
            self._pods[uid] = pod
            self._apply(pod, +1)

    def _apply(self, pod: _Pod, sign: int) -> None:
        # A pod may be reported before its node; a node deleted first keeps no record.
        rec = self._node(pod.node) if sign > 0 else self._nodes.get(pod.node)
        for key in pod.running:
            if rec is not None:
                _bump(rec.running, key, sign)
            self._refresh(pod.node, key)
        for ident in pod.pending:
            _bump(self._pending_by.setdefault(ident, Counter()), pod.node, sign)
            if not self._pending_by[ident]:
                del self._pending_by[ident]
        for ident in pod.crowd:
            _bump(self._crowd_by.setdefault(ident, Counter()), pod.node, sign)
            if not self._crowd_by[ident]:
                del self._crowd_by[ident]

    # -- queries -------------------------------------------------------------
    def pod_facts(self, refs: Sequence[str], candidates: Collection[str] | None = None) -> PodFacts:
        """Facts about the nodes that hold, pull or crowd this pod's images.

        With ``candidates``, only those nodes, and an image most of them hold
        (the injected daemon image is on every node) goes into ``default``
        with per-node exceptions: the Python-level work stays proportional to
        the nodes that differ, set operations (in C) do the rest.
        """
        self._expire()
        needs: list[Need] = []
        seen: set[str] = set()
        for ref in map(try_parse, refs):
            if ref is None or ref.ident in seen:
                continue
            seen.add(ref.ident)
            size = self.size_of(ref)
            needs.append(Need(ref, size or self.limits.default_image_bytes, size is not None))
        total = sum(n.size for n in needs)
        if not needs:
            return PodFacts((), 0, {}, "")
        cand = None if candidates is None else set(candidates)
        base = 0  # bytes every candidate not in `held` holds
        held: Counter[str] = Counter()  # per-node difference from `base`
        pulling: Counter[str] = Counter()
        own_idents: set[str] = set()
        for need in needs:
            keys = self._names.lookup_keys(need.ref)
            holders = self._holders.get(keys[0], set())
            if len(keys) > 1:
                holders = holders.union(*(self._holders.get(k, ()) for k in keys[1:]))
            if cand is None:
                held.update(dict.fromkeys(holders, need.size))
            elif len(inside := cand & holders) * 2 > len(cand):
                base += need.size
                held.subtract(dict.fromkeys(cand - inside, need.size))
            else:
                held.update(dict.fromkeys(inside, need.size))
            idents = self._names.idents(need.ref)
            own_idents.update(idents)
            pullers = {n for i in idents for n in self._pending_by.get(i, ())} - holders
            pulling.update(dict.fromkeys(_within(pullers, cand), need.size))
        primary = max(needs, key=lambda n: n.size)  # first of equals: an app container
        crowd: Counter[str] = Counter()
        for i in self._names.idents(primary.ref):
            crowd.update(self._crowd_by.get(i, Counter()))
        busy: Counter[str] = Counter()
        for i, nodes in self._pending_by.items():
            if i in own_idents:
                continue
            holding = self._holders.get(i, ())
            for n in nodes:
                if (cand is None or n in cand) and n not in holding:
                    busy[n] = busy.get(n, 0) + 1
        # Equal facts share one object (and one level in the scorer).
        shared: dict[tuple[int, int, int, int], NodeFacts] = {}
        facts: dict[str, NodeFacts] = {}
        for n in {*held, *pulling, *busy, *_within(crowd, cand)}:
            key = (base + held.get(n, 0), pulling.get(n, 0), busy.get(n, 0), crowd.get(n, 0))
            f = shared.get(key)
            if f is None:
                f = shared[key] = NodeFacts(*key)
            facts[n] = f
        return PodFacts(tuple(needs), total, facts, primary.ref.ident, NodeFacts(base))

    def where(self, image: str) -> Where | None:
        """Which nodes hold or are pulling ``image``; None if it is not a reference."""
        self._expire()
        ref = try_parse(image)
        if ref is None:
            return None
        holders: dict[str, list[str]] = {}
        for k in self._names.lookup_keys(ref):
            for n in self._holders.get(k, ()):
                rec = self._nodes[n]
                ev = holders.setdefault(n, [])
                for name, yes in (
                    ("reported", k in rec.reported),
                    ("running", rec.running[k] > 0),
                    ("observed", k in rec.observed),
                ):
                    if yes and name not in ev:
                        ev.append(name)
        pulling: Counter[str] = Counter()
        for i in self._names.idents(ref):
            for n, count in self._pending_by.get(i, Counter()).items():
                if n not in holders:
                    pulling[n] += count
        return Where(
            ref.key,
            self.size_of(ref),
            {n: tuple(ev) for n, ev in sorted(holders.items())},
            dict(sorted(pulling.items())),
        )

    def stats(self) -> IndexStats:
        return IndexStats(
            nodes=len(self._nodes),
            image_names=len(self._names),
            entries=sum(len(n) for n in self._holders.values()),
            pods=len(self._pods),
            assumed=len(self._assumed),
        )

    def knows_pod(self, uid: str) -> bool:
        pod = self._pods.get(uid)
        return pod is not None and not pod.assumed


def _within(nodes: Collection[str], cand: set[str] | None) -> Iterable[str]:
    """``nodes`` that are candidates, iterating whichever side is smaller."""
    if cand is None:
        return nodes
    if len(nodes) > len(cand):
        return [n for n in cand if n in nodes]
    return [n for n in nodes if n in cand]


def _bump(counter: Counter[str], key: str, sign: int) -> None:
    counter[key] += sign
    if counter[key] <= 0:
        del counter[key]
