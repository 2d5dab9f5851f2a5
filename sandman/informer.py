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

from sandman.kube_async import ApiError, KubeClient, Resource, WatchExpired, list_all

log = logging.getLogger(__name__)

Handler = Callable[[str, dict[str, Any]], None]

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
    ) -> None:
        self.client = client
        self.resource = resource
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
        items, rv = await list_all(self.client, self.resource, self.namespace, **self.selectors)
        fresh = {key_of(o): o for o in items}
        for k in set(self.store) - set(fresh):
            self._emit("DELETED", self.store.pop(k))
        for k, o in fresh.items():
            self.store[k] = o
            self._emit("ADDED", o)
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
                        self.store[k] = obj
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
