"""When each object of a kind first became Ready, seen through one watch.

Both systems' rows time readiness the same way: a watch on the namespace,
opened before the clock starts, stamps the first event in which an object's
Ready condition is True. Waiting on a name is waiting on that stamp.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandman.kube_async import KubeClient, Resource, WatchExpired, list_all

Predicate = Callable[[dict[str, Any]], bool]


@dataclass
class ReadyLog:
    kube: KubeClient
    resource: Resource
    namespace: str
    ready: Predicate
    label_selector: str | None = None
    first_ready: dict[str, float] = field(default_factory=dict)  # name -> monotonic
    last: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> latest object
    _waiters: dict[str, asyncio.Event] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None
    _started: asyncio.Event = field(default_factory=asyncio.Event)

    async def __aenter__(self) -> ReadyLog:
        self._task = asyncio.create_task(self._run())
        await self._started.wait()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def _see(self, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"]["name"]
        self.last[name] = obj
        if name not in self.first_ready and self.ready(obj):
            self.first_ready[name] = now
            ev = self._waiters.get(name)
            if ev is not None:
                ev.set()

    async def _run(self) -> None:
        params = {"label_selector": self.label_selector} if self.label_selector else {}
        while True:
            items, rv = await list_all(self.kube, self.resource, self.namespace, **params)
            now = time.monotonic()
            for obj in items:
                self._see(obj, now)
            self._started.set()
            try:
                while True:
                    async for kind, obj in self.kube.watch(
                        self.resource, self.namespace, resource_version=rv, **params
                    ):
                        rv = obj["metadata"].get("resourceVersion", rv)
                        if kind in ("ADDED", "MODIFIED"):
                            self._see(obj, time.monotonic())
            except WatchExpired:
                continue

    async def wait(self, name: str, timeout_s: float) -> float:
        """The monotonic time ``name`` first became Ready (TimeoutError after ``timeout_s``)."""
        if name in self.first_ready:
            return self.first_ready[name]
        ev = self._waiters.setdefault(name, asyncio.Event())
        await asyncio.wait_for(ev.wait(), timeout_s)
        return self.first_ready[name]
