"""Kubernetes Events with stable reasons, written off the hot path.

Events are for humans (`kubectl describe`, `kubectl get events`), so losing
one under pressure is acceptable and slowing an admission or a reclaim for
one is not: events are queued, written by one background task, and dropped
(and counted) when the queue is full.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandman.contract import format_time
from sandman.kube_async import EVENTS, ApiError, KubeClient

log = logging.getLogger(__name__)

# A burst of 1,000 denials (a broken ReplicaSet) fits; beyond that, dropping
# is better than holding memory for messages nobody will read in time.
QUEUE_SIZE = 1000
DRAIN_S = 2.0  # at shutdown; well inside a pod's 30 s termination grace


@dataclass(frozen=True)
class ObjectRef:
    kind: str
    namespace: str
    name: str
    uid: str = ""
    api_version: str = "v1"

    @classmethod
    def of(cls, obj: dict[str, Any], kind: str = "Pod", api_version: str = "v1") -> ObjectRef:
        md = obj.get("metadata") or {}
        return cls(
            kind, md.get("namespace", ""), md.get("name", ""), md.get("uid", ""), api_version
        )


class EventRecorder:
    """Queues Events and writes them from one task. Event-loop only."""

    def __init__(
        self, client: KubeClient, component: str, clock: Callable[[], dt.datetime] | None = None
    ) -> None:
        self.client = client
        self.component = component
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_SIZE)
        self.dropped = 0
        self.written = 0

    def emit(self, ref: ObjectRef, reason: str, message: str, type_: str = "Normal") -> None:
        now = format_time(self.clock())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{ref.name or 'sandbox'}.{secrets.token_hex(8)}",
                "namespace": ref.namespace or "default",
            },
            "involvedObject": {
                "kind": ref.kind,
                "namespace": ref.namespace,
                "name": ref.name,
                "apiVersion": ref.api_version,
                **({"uid": ref.uid} if ref.uid else {}),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1

    async def run(self, stop: asyncio.Event) -> None:
        drain_until: float | None = None
        loop = asyncio.get_running_loop()
        while not stop.is_set() or not self.queue.empty():
            if stop.is_set():
                # Shutting down: a couple of seconds to flush, then drop the rest
                # rather than hold up the process (a pod is waiting to stop).
                drain_until = drain_until or loop.time() + DRAIN_S
                if loop.time() > drain_until:
                    self.dropped += self.queue.qsize()
                    return
            try:
                event = await asyncio.wait_for(self.queue.get(), 0.5)
            except TimeoutError:
                continue
            try:
                await self.client.create(EVENTS, event, event["metadata"]["namespace"])
                self.written += 1
            except (ApiError, OSError, TimeoutError) as e:
                log.warning("event %s not written: %s", event["reason"], e)
