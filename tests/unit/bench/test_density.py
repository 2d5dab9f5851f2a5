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
