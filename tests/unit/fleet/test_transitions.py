"""A problem's counts move only through named transitions, the same on every path."""

from __future__ import annotations

from typing import Any

from sandman.client import Sandbox
from sandman.fleet.reuse import ProblemState


def state(**kw: Any) -> ProblemState:
    base = {"index": 0, "rollouts": 4, "undispatched": 4, "unserved": 4}
    return ProblemState(**{**base, **kw})


def counts(s: ProblemState) -> tuple[int, int, int]:
    return s.unserved, s.live, s.acquiring


def test_a_reservation_counts_toward_k_until_given_back() -> None:
    s = state()
    s.reserve()
    assert counts(s) == (4, 1, 1)
    assert not s.can_start(reuse=True, k=1)  # its one sandbox is spoken for
    assert s.want(reuse=True, k=1) == 1  # ... but has no pod yet: the pool offers one
    s.unreserve()
    assert counts(s) == (4, 0, 0)
    assert s.can_start(reuse=True, k=1)


def test_a_dropped_sandbox_frees_a_place_only_with_reuse() -> None:
    s = state(live=2)
    s.dropped(reuse=False)
    assert s.live == 2  # without reuse live is not kept
    s.dropped(reuse=True)
    assert s.live == 1


def test_a_reused_sandbox_serves_without_a_reservation() -> None:
    s = state(live=1, idle=[Sandbox(None, {"metadata": {"name": "p", "namespace": "n"}})])  # type: ignore[arg-type]
    s.idle.pop()
    s.reused()
    assert counts(s) == (3, 1, 0)


def test_an_infrastructure_error_in_the_task_puts_the_rollout_back_until_it_gives_up() -> None:
    s = state(unserved=3)  # one rollout already has its sandbox
    s.needs_another()  # the sandbox died under the task
    assert s.unserved == 4
    s.gave_up()  # out of attempts: it will not need one any more
    assert s.unserved == 3
