"""The density benchmark's reading of a pod's memory cgroup (cgroup v1)."""

from __future__ import annotations

from sandman.bench.density import memory_stat, pod_figures

STAT = """cache 1000
rss 500
total_cache 14680064
total_rss 18874368
total_inactive_file 12582912
total_active_file 2097152
hierarchical_memory_limit 9223372036854771712
"""


def test_working_set_is_usage_minus_inactive_file_pages() -> None:
    stat = memory_stat(STAT)
    assert stat["total_rss"] == 18874368 and "hierarchical_memory_limit" in stat
    got = pod_figures(36 << 20, stat)
    assert got == {
        "usage": 36 << 20,
        "working_set": (36 << 20) - 12582912,  # the tree's cold pages do not count
        "rss": 18874368,
        "cache": 14680064,
    }


def test_working_set_never_goes_below_zero() -> None:
    assert pod_figures(100, {"total_inactive_file": 4096})["working_set"] == 0


def test_only_a_full_node_ends_the_fill_and_retries_are_bounded() -> None:
    from sandman.bench.density import MAX_RETRIES, failure_action
    from sandman.client import SandboxStartError

    def err(reason: str) -> SandboxStartError:
        return SandboxStartError(reason, "x", retryable=True)

    assert failure_action(err(SandboxStartError.UNSCHEDULABLE), 0) == "full"
    assert failure_action(err(SandboxStartError.ADMISSION_UNAVAILABLE), 0) == "retry"
    assert failure_action(err(SandboxStartError.TIMEOUT), MAX_RETRIES - 1) == "retry"
    assert failure_action(err(SandboxStartError.TIMEOUT), MAX_RETRIES) == "raise"
    assert failure_action(RuntimeError("bug"), 0) == "raise"
