"""/v1/status and /v1/idle: uptime, activity, processes, resource usage.

The reaper reads the idle figure to reclaim idle sandboxes without any
control-plane write per heartbeat. Idle means: no API request or stream open
(a 40-minute exec is activity for all of its 40 minutes, not only at its
start), no background process running that keeps the sandbox active, and
none of either for ``idle_s`` seconds. Looking (health checks, status,
metrics, the idle figure itself) is not using.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Activity:
    """Wall-clock start, last activity and what is in flight now.

    Exists so that the idle reaper never deletes a sandbox mid-command: the
    old rule (``last`` moved when a request started) made any call longer than
    the idle timeout look idle. Event-loop only, not thread-safe.
    """

    clock: Callable[[], float] = time.time
    started: float = field(default=0.0)
    last: float = field(default=0.0)
    calls: int = 0
    in_flight: int = 0

    def __post_init__(self) -> None:
        self.started = self.last = self.clock()

    def begin(self) -> None:
        """A request (or stream) that counts as use starts; pair with end()."""
        self.in_flight += 1
        self.calls += 1
        self.last = self.clock()

    def end(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        self.last = self.clock()

    def mark(self) -> None:
        """Something that kept the sandbox busy just ended (a background process)."""
        self.last = max(self.last, self.clock())

    def idle_s(self, busy: bool = False) -> float:
        """Seconds without use; 0 while a request is open or ``busy`` (work running)."""
        if self.in_flight or busy:
            return 0.0
        return max(0.0, self.clock() - self.last)


def processes() -> list[dict[str, Any]]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        f = stat.rsplit(")", 1)[1].split()
        out.append(
            {
                "pid": int(entry),
                "ppid": int(f[1]),
                "state": f[0],
                "cmd": [a.decode(errors="replace") for a in cmdline.split(b"\0") if a] or [comm],
                "cpu_s": (int(f[11]) + int(f[12])) / CLK_TCK,
                "rss_bytes": int(f[21]) * PAGE,
            }
        )
    return sorted(out, key=lambda p: p["pid"])


def _read_int(*paths: str) -> int | None:
    for p in paths:
        try:
            return int(Path(p).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return None


def resources() -> dict[str, Any]:
    """The container's usage from its cgroup (v2 or v1), where readable."""
    memory = _read_int(
        "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory/memory.usage_in_bytes"
    )
    limit = _read_int("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
    cpu_ns = _read_int("/sys/fs/cgroup/cpuacct/cpuacct.usage", "/sys/fs/cgroup/cpuacct.usage")
    if cpu_ns is None:
        try:
            for line in Path("/sys/fs/cgroup/cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec"):
                    cpu_ns = int(line.split()[1]) * 1000
        except OSError:
            pass
    pids = _read_int("/sys/fs/cgroup/pids.current", "/sys/fs/cgroup/pids/pids.current")
    st = os.statvfs("/")
    return {
        "memory_bytes": memory,
        "memory_limit_bytes": limit,
        "cpu_seconds": cpu_ns / 1e9 if cpu_ns is not None else None,
        "pids": pids,
        "rootfs_free_bytes": st.f_bavail * st.f_frsize,
        "load_avg": list(os.getloadavg()),
    }
