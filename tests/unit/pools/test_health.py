"""A pool's health from its pods: counts, reasons and the condition."""

from __future__ import annotations

from typing import Any

import pytest

from sandman.contract import LABEL_POOL, LABEL_STATE
from sandman.pools.health import FAILING, HEALTHY, WARMING, PoolHealth, pool_health
from sandman.pools.spec import STATE_CLAIMED, STATE_IDLE


def pod(
    name: str,
    *,
    state: str | None = STATE_IDLE,
    ready: bool = False,
    deleting: bool = False,
    waiting: tuple[str, str] | None = None,
    phase: str = "Pending",
    unschedulable: bool = False,
) -> dict[str, Any]:
    labels = {LABEL_POOL: "p"}
    if state is not None:
        labels[LABEL_STATE] = state
    md: dict[str, Any] = {"name": name, "labels": labels}
    if deleting:
        md["deletionTimestamp"] = "2026-11-30T12:00:00Z"
    status: dict[str, Any] = {"phase": "Running" if ready else phase, "conditions": []}
    if ready:
        status["conditions"].append({"type": "Ready", "status": "True"})
    if unschedulable:
        status["conditions"].append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "x"}
        )
    if waiting:
        reason, message = waiting
        status["containerStatuses"] = [
            {
                "name": "main",
                "image": "reg/img:1",
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ]
    return {"metadata": md, "status": status}


MISSING_IMAGE = ("ErrImagePull", "failed to resolve reference: manifest unknown")
FLAKY_PULL = ("ErrImagePull", "dial tcp 10.0.0.1:5000: i/o timeout")


def test_empty_pool_is_healthy():
    h = pool_health([])
    assert h == PoolHealth()
    assert h.condition == HEALTHY
    assert (h.ready, h.starting, h.failing, h.claimed, h.reasons, h.message) == (0, 0, 0, 0, {}, "")


def test_counts_each_kind_of_pod():
    h = pool_health(
        [
            pod("r1", ready=True),
            pod("r2", ready=True),
            pod("s1"),
            pod("s2", unschedulable=True),  # a pool pod has no deadline: still starting
            pod("s3", waiting=FLAKY_PULL),  # retryable: still starting
            pod("f1", waiting=MISSING_IMAGE),
            pod("c1", state=STATE_CLAIMED, ready=True),
            pod("c2", state=STATE_CLAIMED),  # claimed is claimed, Ready or not
        ]
    )
    assert (h.ready, h.starting, h.failing, h.claimed) == (2, 3, 1, 2)
    assert h.reasons == {"ImageNotFound": 1}
    assert h.condition == HEALTHY  # something is claimable


def test_terminating_and_foreign_pods_are_ignored():
    h = pool_health(
        [
            pod("t-ready", ready=True, deleting=True),
            pod("t-failing", waiting=MISSING_IMAGE, deleting=True),
            pod("t-claimed", state=STATE_CLAIMED, deleting=True),
            pod("no-state", state=None, ready=True),
            pod("other-state", state="draining", waiting=MISSING_IMAGE),
            {"metadata": {}},
            {},
        ]
    )
    assert h == PoolHealth()


def test_failing_when_nothing_ready_and_a_pod_cannot_start():
    h = pool_health(
        [
            pod("f1", waiting=MISSING_IMAGE),
            pod("f2", waiting=("ImagePullBackOff", "reg/img:1: not found")),
            pod("f3", waiting=("CrashLoopBackOff", "back-off 40s restarting")),
            pod("s1"),  # even with one still starting
        ]
    )
    assert h.condition == FAILING
    assert (h.ready, h.starting, h.failing) == (0, 1, 3)
    assert h.reasons == {"ImageNotFound": 2, "ContainerFailed": 1}
    # the first failing pod's message explains it
    assert "manifest unknown" in h.message
    assert "reg/img:1" in h.message


@pytest.mark.parametrize(
    "bad",
    [
        pod("invalid", waiting=("InvalidImageName", "bad ref")),
        pod("config", waiting=("CreateContainerConfigError", "secret x not found")),
        pod("never", waiting=("ErrImageNeverPull", "not present")),
        pod("ended", phase="Failed"),
    ],
    ids=lambda p: p["metadata"]["name"],
)
def test_each_non_retryable_cause_fails(bad):
    h = pool_health([bad])
    assert (h.failing, h.starting, h.condition) == (1, 0, FAILING)
    assert sum(h.reasons.values()) == 1
    assert h.message


@pytest.mark.parametrize(
    "slow",
    [
        pod("flaky", waiting=FLAKY_PULL),
        pod("backoff", waiting=("ImagePullBackOff", "connection refused")),
        pod("unschedulable", unschedulable=True),
        pod("creating", waiting=("ContainerCreating", "")),
        pod("plain"),
    ],
    ids=lambda p: p["metadata"]["name"],
)
def test_retryable_causes_are_warming_not_failing(slow):
    h = pool_health([slow])
    assert (h.failing, h.starting, h.condition) == (0, 1, WARMING)
    assert h.reasons == {}
    assert h.message == ""


def test_ready_pod_keeps_a_pool_healthy_despite_failures():
    h = pool_health([pod("r", ready=True), pod("f", waiting=MISSING_IMAGE), pod("s")])
    assert h.condition == HEALTHY
    assert (h.ready, h.starting, h.failing) == (1, 1, 1)
    assert h.reasons == {"ImageNotFound": 1}  # still reported


def test_claimed_pods_do_not_make_a_pool_healthy():
    h = pool_health([pod("c", state=STATE_CLAIMED, ready=True), pod("s")])
    assert h.condition == WARMING
    h = pool_health([pod("c", state=STATE_CLAIMED, ready=True), pod("f", waiting=MISSING_IMAGE)])
    assert h.condition == FAILING


def test_only_claimed_pods_is_healthy():
    h = pool_health([pod("c", state=STATE_CLAIMED)])
    assert (h.claimed, h.condition) == (1, HEALTHY)


def test_to_json_is_plain_data():
    h = pool_health([pod("f", waiting=MISSING_IMAGE)])
    assert h.to_json() == {
        "ready": 0,
        "starting": 0,
        "failing": 1,
        "claimed": 0,
        "expired": 0,
        "restarted": 0,
        "condition": FAILING,
        "reasons": {"ImageNotFound": 1},
        "message": h.message,
    }


def test_idle_pods_ended_by_their_deadline_are_expired_not_failing() -> None:
    from sandman.pools.health import is_expired

    old = {
        "metadata": {"name": "a", "labels": {"sandman.dev/state": "idle"}},
        "status": {"phase": "Failed", "reason": "DeadlineExceeded"},
    }
    crashed = {
        "metadata": {"name": "b", "labels": {"sandman.dev/state": "idle"}},
        "status": {"phase": "Failed", "reason": "Error"},
    }
    assert is_expired(old) and not is_expired(crashed)
    h = pool_health([old, crashed])
    assert (h.expired, h.failing) == (1, 1)
