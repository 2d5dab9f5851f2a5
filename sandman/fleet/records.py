"""What a fleet run observed: one record per rollout and one span per sandbox.

Times are seconds since the run's start (``time.monotonic()`` minus the
run's t0, taken before any warming), so strategies compare fairly and a
report never mixes clocks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Outcome(enum.StrEnum):
    OK = "ok"  # the task ran; its reward is valid (may be 0.0)
    TASK_FAILED = "task_failed"  # the task itself raised: the agent's fault, not ours
    INFRA_FAILED = "infra_failed"  # no valid result: every attempt hit an infrastructure error


class Source(enum.StrEnum):
    CREATED = "created"  # a pod created on demand for this rollout
    CLAIMED = "claimed"  # a warm pod claimed from a pool
    REUSED = "reused"  # a sandbox reset after an earlier rollout of the same problem


@dataclass
class Attempt:
    """One try at getting a sandbox and running the task in it."""

    source: Source | None = None
    sandbox: str | None = None
    t_requested: float = 0.0
    t_acquired: float | None = None  # sandbox Ready (created/claimed) or reset done (reused)
    t_first_result: float | None = None  # first command's result (TTFC end)
    t_done: float | None = None
    phases: dict[str, float | None] = field(default_factory=dict)  # create/schedule/start/ready
    error_reason: str | None = None  # e.g. ImageNotFound, Unreachable, ResetFailed
    retryable: bool | None = None
    warm: bool = False  # claimed from a pool while Ready: no start to wait for


@dataclass
class RolloutRecord:
    problem: str
    rollout: int
    outcome: Outcome | None = None
    reward: float | None = None
    attempts: list[Attempt] = field(default_factory=list)
    t_queued: float = 0.0  # when the rollout was handed to the fleet
    t_slot: float | None = None  # when it got one of the `concurrency` slots
    detail: str = ""  # task error text, or the last infrastructure error

    @property
    def final(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def ttfc_s(self) -> float | None:
        """Request of the sandbox that produced the result -> its first command's result."""
        a = self.final
        if a is None or self.outcome is Outcome.INFRA_FAILED:
            return None
        end = a.t_first_result if a.t_first_result is not None else a.t_acquired
        return None if end is None else end - a.t_requested


@dataclass
class SandboxSpan:
    """A pod's life as the run saw it: for the timeline plot and peak-held counts."""

    name: str
    problem: str
    source: Source  # CREATED (on demand) or CLAIMED (born in a pool; claimed or not)
    t_created: float
    t_ready: float | None = None
    t_claimed: float | None = None  # pool pods only
    t_released: float | None = None
    rollouts: int = 0  # how many rollouts it served
    quarantined: bool = False


@dataclass
class RunCounters:
    pods_created: int = 0  # on demand + by pools (every pod the run caused)
    claims: int = 0
    claim_conflicts: int = 0  # lost races, retried on another pod
    resets: int = 0
    resets_dirty: int = 0  # drift, failed reset or restarted container: replaced
    rotations: int = 0  # retired after max_reuses
    infra_retries: int = 0
    prepulls: int = 0  # pre-pull pods created (not in pods_created: they are not sandboxes)
    prepulls_skipped: int = 0  # the extender said a node holds or pulls the image already


@dataclass
class RunData:
    """Everything a report needs; JSON-serialisable via ``to_json``."""

    strategy: str
    reuse: bool
    problems: int
    rollouts_per_problem: int
    concurrency: int
    params: dict[str, Any] = field(default_factory=dict)  # window, k, max_reuses, ...
    records: list[RolloutRecord] = field(default_factory=list)
    spans: list[SandboxSpan] = field(default_factory=list)
    counters: RunCounters = field(default_factory=RunCounters)
    t_end: float | None = None  # when the fleet finished cleaning up
