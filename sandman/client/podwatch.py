"""One pod watch per namespace for every sandbox of a client that waits to start.

Each waiting sandbox used to hold a watch request of its own: 64 sandboxes
created at once held 64 connections of the client's pool (64 by default),
so the 65th create queued behind watches that last up to a minute, and the
apiserver served 64 watches for one client. Here the waiters of a namespace
share one watch of its sandbox pods (``sandman.dev/sandbox=true``), started
by the first waiter and stopped when the last one leaves.

A waiter MUST read its pod after it starts following (``follow`` then GET):
events from before it followed went to nobody. It is told ``RESYNC`` when
the watch had to start over (its resourceVersion expired, or the connection
broke), and reads its pod again; an error the watch cannot get past is handed
to every waiter as ``("ERROR", exception)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from sandman.contract import LABEL_SANDBOX
from sandman.kube_async import PODS, KubeClient, WatchExpired

log = logging.getLogger(__name__)

RESYNC = "RESYNC"
ERROR = "ERROR"
SELECTOR = f"{LABEL_SANDBOX}=true"
# A watch request ends after this long and is renewed from the last
# resourceVersion (the apiserver's own default is 5-10 minutes; shorter
# keeps a half-dead connection from hiding events for long).
WATCH_TIMEOUT_S = 60
# Connection-level failures in a row before waiters are told: a restart of
# the apiserver or a dropped connection should cost a RESYNC, not a start.
MAX_BROKEN = 3
BROKEN_PAUSE_S = 0.5

Event = tuple[str, Any]


@dataclass
class _Group:
    waiters: dict[str, set[asyncio.Queue[Event]]] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    # Set once the watch has its starting resourceVersion (or has failed):
    # a waiter's own read MUST come after it, or changes between the two
    # reads would reach nobody.
    started: asyncio.Event = field(default_factory=asyncio.Event)

    def queues(self) -> list[asyncio.Queue[Event]]:
        return [q for qs in self.waiters.values() for q in qs]


class PodWatch:
    """Shared per-namespace pod watches of one client (event-loop only)."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self._groups: dict[str, _Group] = {}
        self.watches_started = 0  # watch groups started (tests and benchmarks read it)

    @contextlib.asynccontextmanager
    async def follow(self, namespace: str, name: str) -> AsyncIterator[asyncio.Queue[Event]]:
        """Events of pod ``name`` while the block runs: (type, pod) from the
        watch, (RESYNC, None) or (ERROR, exception)."""
        group = self._groups.get(namespace)
        if group is None or group.task is None or group.task.done():
            group = _Group()
            self._groups[namespace] = group
            group.task = asyncio.get_running_loop().create_task(self._run(namespace, group))
            self.watches_started += 1
        q: asyncio.Queue[Event] = asyncio.Queue()
        group.waiters.setdefault(name, set()).add(q)
        try:
            await group.started.wait()
            yield q
        finally:
            qs = group.waiters.get(name)
            if qs is not None:
                qs.discard(q)
                if not qs:
                    del group.waiters[name]
            if not group.waiters and group.task is not None:
                group.task.cancel()
                if self._groups.get(namespace) is group:
                    del self._groups[namespace]

    async def _run(self, namespace: str, group: _Group) -> None:
        try:
            await self._watch(namespace, group)
        finally:
            group.started.set()  # a waiter never waits on a watch that ended

    async def _watch(self, namespace: str, group: _Group) -> None:
        rv: str | None = None
        broken = 0
        while True:
            try:
                if rv is None:
                    doc = await self.kube.list(PODS, namespace, label_selector=SELECTOR, limit=1)
                    rv = str(doc["metadata"]["resourceVersion"])
                    if group.started.is_set():  # a restart: waiters read their pods again
                        _tell(group.queues(), (RESYNC, None))
                    group.started.set()
                async for kind, obj in self.kube.watch(
                    PODS,
                    namespace,
                    resource_version=rv,
                    timeout_s=WATCH_TIMEOUT_S,
                    label_selector=SELECTOR,
                ):
                    broken = 0
                    rv = obj.get("metadata", {}).get("resourceVersion") or rv
                    if kind == "BOOKMARK":
                        continue
                    name = obj.get("metadata", {}).get("name", "")
                    _tell(list(group.waiters.get(name, ())), (kind, obj))
            except WatchExpired:
                rv = None
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                broken += 1
                if broken >= MAX_BROKEN:
                    _tell(group.queues(), (ERROR, e))
                    return
                log.debug("pod watch of %s broke (%s); resuming", namespace, e)
                await asyncio.sleep(BROKEN_PAUSE_S)
                rv = None  # read again: events may have been lost with the connection
            except asyncio.CancelledError:
                raise
            except Exception as e:  # an API error (403, 500...): every waiter hears of it
                _tell(group.queues(), (ERROR, e))
                return


def _tell(queues: list[asyncio.Queue[Event]], ev: Event) -> None:
    for q in queues:
        q.put_nowait(ev)
