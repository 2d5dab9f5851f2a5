"""`sandman bench gvisor`'s summaries and side-by-side table (pure parts)."""

from __future__ import annotations

from sandman.bench.gvisor import _start_summary, markdown_table


def test_start_summary_takes_median_and_max_per_key() -> None:
    got = _start_summary([{"ready_s": 3.0, "x": 1.0}, {"ready_s": 1.0}, {"ready_s": 2.0}])
    assert got == {"ready_s_p50": 2.0, "ready_s_max": 3.0, "x_p50": 1.0, "x_max": 1.0}


def test_table_puts_runtimes_side_by_side_with_the_ratio() -> None:
    table = markdown_table(
        {
            "runc": {"ready_s_p50": 2.0, "exec_p50_ms": 5.0, "daemon_start_s_p50": 0.1},
            "gvisor": {"ready_s_p50": 3.0, "exec_p50_ms": 15.0, "daemon_start_s_p50": 0.15},
        }
    )
    lines = table.splitlines()
    assert lines[0] == "| | runc | gVisor | gVisor / runc |"
    assert "| create -> Ready p50 (s) | 2.00 | 3.00 | 1.50 |" in lines
    assert "| exec `true` p50 (ms) | 5.0 | 15.0 | 3.00 |" in lines
    assert "| daemon start (interpreter + imports) p50 (ms) | 100 | 150 | 1.50 |" in lines
    # A figure one side lacks is shown as "-", never as a made-up ratio.
    assert "| write 100 MB (MB/s) | - | - | - |" in lines
