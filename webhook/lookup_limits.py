"""How many registry lookups may run at once, and which hosts are resting (no I/O).

Lookups share the webhook's event loop and connection pool. Without bounds,
a namespace that creates pods naming many unique tags on a registry that
accepts connections and never answers holds every connection, and then
uncached lookups in every other namespace miss their budget and enforce
rules deny their pods. So a lookup that would go over a bound per registry
host, per namespace or in total fails at once with a message that says
which bound (a wait would spend the admission's budget in a queue), and a
host whose lookup timed out or could not be reached rests a few seconds:
the pods after it fail at once instead of each waiting out the budget.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

# 8 per registry host: the client's per-host connection bound
# (sandman.registry.POOL_LIMIT_PER_HOST), so a lookup never queues for a
# connection; a lookup costs 0.1-1 s, so 8 serve 8-80 unique images a second
# per registry (a burst of one image is one lookup).
PER_HOST = 8
# 16 per namespace: two registries' worth; one namespace cannot take more
# than a quarter of the total.
PER_NAMESPACE = 16
# 64 in total: the client's pool is 100 connections; the rest are for the
# background fetches past the budget (BACKGROUND_GRACE_S) that still hold one.
TOTAL = 64
# 5 s, as the image cache's FAILURE_TTL_S: a controller's immediate retry is
# answered at once, a registry back from a blip is asked again soon.
HOST_REST_S = 5.0
# Hosts remembered as resting; a host is a few dozen bytes.
MAX_RESTING = 1024


@dataclass(frozen=True)
class Limits:
    per_host: int = PER_HOST
    per_namespace: int = PER_NAMESPACE
    total: int = TOTAL


@dataclass
class Counts:
    """Lookups running now, by registry host and by namespace."""

    total: int = 0
    hosts: dict[str, int] = field(default_factory=dict)
    namespaces: dict[str, int] = field(default_factory=dict)


def over_bound(limits: Limits, counts: Counts, host: str, namespace: str) -> str | None:
    """Which bound one more lookup of ``host`` for ``namespace`` would pass, else None."""
    if counts.hosts.get(host, 0) >= limits.per_host:
        return f"{limits.per_host} lookups already running for this registry"
    if counts.namespaces.get(namespace, 0) >= limits.per_namespace:
        return f"{limits.per_namespace} lookups already running for namespace {namespace}"
    if counts.total >= limits.total:
        return f"{limits.total} lookups already running in the webhook"
    return None


class InFlight:
    """Counts running lookups and refuses those over a bound.

    Exists so that lookups of one slow host or one namespace cannot take the
    connections every other namespace's lookups need. ``start`` checks and
    counts in one step and ``end`` MUST follow every successful ``start``
    (a done-callback of the lookup's task), or the slot leaks. Event-loop
    only: no awaits between check and count, so no lock is needed."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.counts = Counts()

    def start(self, host: str, namespace: str) -> str | None:
        """Count one lookup and return None, or return why it may not start."""
        why = over_bound(self.limits, self.counts, host, namespace)
        if why is not None:
            return why
        c = self.counts
        c.total += 1
        c.hosts[host] = c.hosts.get(host, 0) + 1
        c.namespaces[namespace] = c.namespaces.get(namespace, 0) + 1
        return None

    def end(self, host: str, namespace: str) -> None:
        c = self.counts
        c.total -= 1
        for m, k in ((c.hosts, host), (c.namespaces, namespace)):
            m[k] -= 1
            if m[k] <= 0:
                del m[k]


class HostFailures:
    """Registry hosts that just timed out or could not be reached, for ``rest_s``.

    Exists so that a host that does not answer costs one lookup's budget,
    not every pod's: while it rests, lookups there fail at once. Bounded
    (oldest forgotten first); injected clock; event-loop only."""

    def __init__(
        self,
        clock: Callable[[], float],
        rest_s: float = HOST_REST_S,
        max_hosts: int = MAX_RESTING,
    ) -> None:
        self.clock = clock
        self.rest_s = rest_s
        self.max_hosts = max_hosts
        self._until: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def resting(self, host: str) -> str | None:
        """The reason ``host`` failed, while it rests; else None."""
        hit = self._until.get(host)
        if hit is None:
            return None
        if self.clock() >= hit[0]:
            del self._until[host]
            return None
        return hit[1]

    def failed(self, host: str, reason: str) -> None:
        self._until[host] = (self.clock() + self.rest_s, reason)
        self._until.move_to_end(host)
        while len(self._until) > self.max_hosts:
            self._until.popitem(last=False)
