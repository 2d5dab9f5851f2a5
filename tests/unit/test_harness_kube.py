"""started_since: telling a pod's status after a node restart from the stale one."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sandman.harness.kube import started_since

RESTART = datetime(2026, 12, 1, 22, 43, 10, 500_000, tzinfo=UTC)


def pod(*started: str | None) -> dict[str, Any]:
    statuses = [
        {"name": f"c{i}", "state": {"running": {"startedAt": s}} if s else {"waiting": {}}}
        for i, s in enumerate(started)
    ]
    return {
        "spec": {"containers": [{"name": f"c{i}"} for i in range(len(started))]},
        "status": {"containerStatuses": statuses},
    }


def test_containers_started_after_the_restart_count() -> None:
    assert started_since(pod("2026-12-01T22:43:30Z", "2026-12-01T22:44:00Z"), RESTART)


def test_the_same_second_counts_since_the_api_drops_the_fraction() -> None:
    assert started_since(pod("2026-12-01T22:43:10Z"), RESTART)


def test_a_container_from_before_the_restart_is_stale() -> None:
    assert not started_since(pod("2026-12-01T22:43:30Z", "2026-12-01T22:40:00Z"), RESTART)


def test_a_container_not_running_or_not_reported_does_not_count() -> None:
    assert not started_since(pod("2026-12-01T22:43:30Z", None), RESTART)
    no_status = pod("2026-12-01T22:43:30Z")
    no_status["status"] = {}
    assert not started_since(no_status, RESTART)
    missing_one = pod("2026-12-01T22:43:30Z", "2026-12-01T22:43:30Z")
    missing_one["status"]["containerStatuses"].pop()
    assert not started_since(missing_one, RESTART)
