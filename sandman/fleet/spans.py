"""Sandbox lifetimes as a run sees them (for peak-held counts and the timeline)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sandman.client import startup
from sandman.contract import LABEL_POOL, LABEL_STATE
from sandman.fleet.records import SandboxSpan, Source
from sandman.pools.spec import STATE_CLAIMED


class SpanBook:
    """Event-loop only. Times are seconds since the run's t0."""

    def __init__(self, t0: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.t0, self.clock = t0, clock
        self.spans: dict[str, SandboxSpan] = {}

    def now(self) -> float:
        return self.clock() - self.t0

    def pool_pod(
        self, kind: str, pod: dict[str, Any], problem_of: Callable[[str], str | None]
    ) -> None:
        """A pool pod's watch event (from the pool manager's informer)."""
        md = pod["metadata"]
        name = md["name"]
        span = self.spans.get(name)
        if span is None:
            problem = problem_of(md.get("labels", {}).get(LABEL_POOL, ""))
            if problem is None or kind == "DELETED":
                return
            span = self.spans[name] = SandboxSpan(name, problem, Source.CLAIMED, self.now())
        if span.t_ready is None and startup.ready(pod):
            span.t_ready = self.now()
        if span.t_claimed is None and md.get("labels", {}).get(LABEL_STATE) == STATE_CLAIMED:
            span.t_claimed = self.now()
        if span.t_released is None and (kind == "DELETED" or md.get("deletionTimestamp")):
            span.t_released = self.now()

    def created(self, name: str, problem: str, t_requested: float) -> None:
        self.spans.setdefault(name, SandboxSpan(name, problem, Source.CREATED, t_requested))

    def ready(self, name: str) -> None:
        span = self.spans.get(name)
        if span is not None and span.t_ready is None:
            span.t_ready = self.now()

    def claimed(self, name: str) -> None:
        span = self.spans.get(name)
        if span is not None and span.t_claimed is None:
            span.t_claimed = self.now()

    def served(self, name: str) -> None:
        if name in self.spans:
            self.spans[name].rollouts += 1

    def released(self, name: str, *, quarantined: bool = False) -> None:
        span = self.spans.get(name)
        if span is None:
            return
        span.quarantined = span.quarantined or quarantined
        if span.t_released is None:
            span.t_released = self.now()
