"""List-then-watch caches (informers) on the async client.

One informer keeps an up-to-date local copy of one kind of object and calls a
handler for every change. It resumes a broken watch from the last
resourceVersion it saw (bookmarks keep that fresh), relists on 410 Gone and
reports objects that vanished across a relist as deletions, so a consumer
never misses an event. ``synced`` is set once the first list is in the cache:
components must not report ready before that (a reaper or an extender that
acts on a half-filled cache acts wrongly).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

from sandman.kube_async import ApiError, KubeClient, Resource, WatchExpired, list_pages

log = logging.getLogger(__name__)

Handler = Callable[[str, dict[str, Any]], None]
# What the cache keeps of an object (the handler always sees all of it).
Keep = Callable[[dict[str, Any]], dict[str, Any]]

# Backoff after a failed list/watch: 0.2 s doubling to 10 s (client-go's
# reflector uses 0.8 s -> 30 s; ours are local and want to recover fast).
BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 10.0
# Server-side watch timeout; client-go picks 5-10 min at random to spread load.
WATCH_TIMEOUT_S = 300


def key_of(obj: dict[str, Any]) -> str:
    md = obj["metadata"]
    return f"{md.get('namespace', '')}/{md['name']}"


class Informer:
    """A cache of one resource kind. Event-loop only (not thread-safe)."""

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        handler: Handler | None = None,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        keep: Keep | None = None,
    ) -> None:
        """``keep``: what the cache stores of each object (default: all of it).
        The failure it prevents: a cache of whole pods costs ~35 KB of Python
        objects per pod (measured: a 5.6 KB sandbox pod's JSON, managedFields
        and a spec the consumer never reads included), so a controller that
        needs a few fields grows past its memory limit at tens of thousands
        of pods. client-go's ``SetTransform`` is the same idea. Handlers get
        the whole object of a watch event, and ``keep(obj)`` of a cached one
        only where the cache is all there is (a deletion found by a relist),
        so ``keep`` must leave ``metadata.name``/``namespace``/``uid``."""
        self.client = client
        self.resource = resource
        self.keep = keep or (lambda o: o)
        self.handler = handler or (lambda _t, _o: None)
        self.namespace = namespace
        self.selectors = {"label_selector": label_selector, "field_selector": field_selector}
        self.store: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0

    def _emit(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            self.handler(kind, obj)
        except Exception:
            log.exception("informer handler failed on %s %s", kind, key_of(obj))

    async def _relist(self) -> None:
        # Page by page: only one page of whole objects is held at a time.
        before = set(self.store)
        fresh: set[str] = set()
        rv = ""
        async for items, last in list_pages(
            self.client, self.resource, self.namespace, **self.selectors
        ):
            for o in items:
                k = key_of(o)
                fresh.add(k)
                self.store[k] = self.keep(o)
                self._emit("ADDED", o)
            rv = last or rv
        for k in before - fresh:
            self._emit("DELETED", self.store.pop(k))
        self.resource_version = rv
        self.relists += 1
        self.synced.set()

    async def run(self, stop: asyncio.Event) -> None:
        backoff = BACKOFF_START_S
        need_list = True
        while not stop.is_set():
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                timeout = int(WATCH_TIMEOUT_S * (1 + random.random()))
                async for kind, obj in self.client.watch(
                    self.resource,
                    self.namespace,
                    resource_version=self.resource_version,
                    timeout_s=timeout,
                    **self.selectors,
                ):
                    backoff = BACKOFF_START_S
                    self.resource_version = obj["metadata"].get(
                        "resourceVersion", self.resource_version
                    )
                    if kind == "BOOKMARK":
                        continue
                    k = key_of(obj)
                    if kind == "DELETED":
                        self.store.pop(k, None)
                    else:
                        self.store[k] = self.keep(obj)
                    self._emit(kind, obj)
                    if stop.is_set():
                        return
            except WatchExpired:
                need_list = True
            except asyncio.CancelledError:
                raise
            except (ApiError, OSError, TimeoutError, ValueError) as e:
                log.warning(
                    "watch of %s failed (%s); retrying in %.1fs", self.resource.plural, e, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            except Exception as e:
                log.warning(
                    "watch of %s broke (%r); retrying in %.1fs", self.resource.plural, e, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
