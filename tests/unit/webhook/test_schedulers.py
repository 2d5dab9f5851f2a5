"""Is a scheduler running? Judged from its Lease, both sides of each boundary."""

from __future__ import annotations

import datetime as dt

import pytest

from sandman.webhook.schedulers import (
    CLOCK_SKEW_S,
    lease_map,
    lease_problem,
    parse_lease_flag,
    warning_text,
)

NOW = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)


def lease(renewed_s_ago: float, holder: str = "node_abc", duration: int = 15) -> dict:
    t = NOW - dt.timedelta(seconds=renewed_s_ago)
    return {
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "renewTime": t.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),  # MicroTime, as the API writes it
        }
    }


def test_a_renewed_lease_is_a_running_scheduler() -> None:
    # renewed 2 s ago, lease 15 s: running
    assert lease_problem(lease(2), "kube-system/kube-scheduler", NOW) is None
    # the last moment it still counts: duration + clock skew (15 + 10 = 25 s)
    assert lease_problem(lease(15 + CLOCK_SKEW_S), "x/y", NOW) is None


def test_stale_missing_or_unheld_leases_are_problems() -> None:
    stale = lease_problem(lease(15 + CLOCK_SKEW_S + 1), "x/y", NOW)
    assert stale is not None and "last renewed 26s ago by node_abc" in stale
    assert "no Lease x/y" in (lease_problem(None, "x/y", NOW) or "")
    assert "no holder" in (lease_problem(lease(1, holder=""), "x/y", NOW) or "")
    assert "never been renewed" in (
        lease_problem({"spec": {"holderIdentity": "h"}}, "x/y", NOW) or ""
    )


def test_warning_names_the_scheduler_and_the_way_out() -> None:
    text = warning_text("sandman-scheduler", "no Lease sandman-system/sandman-scheduler")
    assert "'sandman-scheduler'" in text and "scheduler: default" in text


def test_lease_flag() -> None:
    assert parse_lease_flag("volcano=volcano-system/vc-scheduler") == (
        "volcano",
        ("volcano-system", "vc-scheduler"),
    )
    with pytest.raises(ValueError, match="SCHEDULER=NAMESPACE/LEASE"):
        parse_lease_flag("volcano")
    # `NAME=`: a scheduler without leader election is not judged at all
    leases = dict(lease_map([parse_lease_flag("sandman-scheduler="), parse_lease_flag("v=a/b")]))
    assert leases == {"default-scheduler": ("kube-system", "kube-scheduler"), "v": ("a", "b")}
