"""What the scale bench reads besides its own record: Prometheus text and /proc.

- ``parse_prometheus`` / ``histogram_quantile``: the apiserver's, etcd's and
  the webhook's own counters and histograms, differenced between two scrapes
  so a figure belongs to one phase;
- ``Sampler``: a thread that samples every component's resident memory and
  CPU time from /proc (host processes and, in-cluster, the processes of the
  component pods on the real node, found by their pod UID in their cgroup),
  so peaks are seen wherever they happen, per phase.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

Sample = dict[tuple[str, frozenset[tuple[str, str]]], float]

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def parse_prometheus(text: str, prefixes: Iterable[str] = ("",)) -> Sample:
    """Every sample whose name starts with one of ``prefixes``."""
    wanted = tuple(prefixes)
    out: Sample = {}
    for line in text.splitlines():
        if not line or line[0] == "#" or not line.startswith(wanted):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = frozenset(_LABEL.findall(m.group(3) or ""))
        try:
            out[(m.group(1), labels)] = float(m.group(4))
        except ValueError:
            continue
    return out


def total(sample: Sample, metric: str, **match: str) -> float:
    """Sum of ``metric`` over the series whose labels include ``match``."""
    want = set(match.items())
    return sum(v for (n, labels), v in sample.items() if n == metric and want <= labels)


def by_label(sample: Sample, metric: str, label: str, **match: str) -> dict[str, float]:
    want = set(match.items())
    out: dict[str, float] = {}
    for (n, labels), v in sample.items():
        if n == metric and want <= labels:
            key = dict(labels).get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out


def delta(after: Sample, before: Sample) -> Sample:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def histogram_quantile(sample: Sample, metric: str, q: float, **match: str) -> float:
    """Prometheus's histogram_quantile over ``name``_bucket (summed over the
    series matching ``match``): linear within the bucket; NaN without data."""
    buckets: dict[float, float] = {}
    want = set(match.items())
    for (n, labels), v in sample.items():
        if n != metric + "_bucket" or not want <= labels:
            continue
        le = dict(labels).get("le", "")
        bound = math.inf if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + v
    if not buckets:
        return math.nan
    bounds = sorted(buckets)
    count = buckets[bounds[-1]]
    if count <= 0:
        return math.nan
    rank = q * count
    prev_bound, prev_count = 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            if math.isinf(b):
                return prev_bound  # above the last finite bucket: its bound is all we know
            if c == prev_count:
                return b
            return prev_bound + (b - prev_bound) * (rank - prev_count) / (c - prev_count)
        prev_bound, prev_count = b, c
    return bounds[-2] if len(bounds) > 1 else math.nan


# -- /proc ---------------------------------------------------------------------------
def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return None


def cpu_seconds(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat.rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def mem_available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def pids_of_pod(uid: str) -> list[int]:
    """Processes whose cgroup path names the pod (kubelet's cgroupfs layout: .../pod<uid>/...)."""
    needle = f"pod{uid}"
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cgroup") as f:
                if needle in f.read():
                    out.append(int(entry))
        except OSError:
            continue
    return out


def descendants(*roots: int) -> list[int]:
    """Every live process below ``roots`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(roots)
    while todo:
        for c in children.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


# -- the sampler ---------------------------------------------------------------------
Resolver = Callable[[], dict[str, list[int]]]  # component -> its processes now


@dataclass
class PhaseStats:
    peak_rss: dict[str, int] = field(default_factory=dict)  # component -> max of one process
    peak_rss_sum: dict[str, int] = field(default_factory=dict)  # ... of all its replicas
    cpu_s: dict[str, float] = field(default_factory=dict)
    min_mem_available: int | None = None
    # The 1-minute load average at each sample (the machine is shared: every
    # figure of a phase is read next to it).
    load1_max: float = 0.0
    load1_sum: float = 0.0
    samples: int = 0
    started: float = 0.0
    ended: float = 0.0


class Sampler:
    """Samples RSS and CPU of every component every ``period`` seconds in a thread.

    The resolver is asked again every ``resolve_every`` samples (a killed
    component comes back with a new pid). CPU time is attributed to the
    phase current when it was sampled. Thread-safe: ``mark``/``phases`` take
    the lock the sampling thread holds while it records.
    """

    def __init__(self, resolve: Resolver, period: float = 2.0, resolve_every: int = 3) -> None:
        self.resolve = resolve
        self.period = period
        self.resolve_every = resolve_every
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._phase = "setup"
        self._stats: dict[str, PhaseStats] = {"setup": PhaseStats(started=time.time())}
        self._cpu_last: dict[int, float] = {}
        self._pids: dict[str, list[int]] = {}
        self._thread = threading.Thread(target=self._run, daemon=True, name="scale-sampler")

    def start(self) -> None:
        self._pids = self.resolve()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def mark(self, phase: str) -> None:
        with self._lock:
            now = time.time()
            self._stats[self._phase].ended = now
            self._phase = phase
            self._stats.setdefault(phase, PhaseStats(started=now))

    def phases(self) -> dict[str, PhaseStats]:
        with self._lock:
            return dict(self._stats)

    def pids(self) -> dict[str, list[int]]:
        with self._lock:
            return {k: list(v) for k, v in self._pids.items()}

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(self.period):
            n += 1
            if n % self.resolve_every == 0:
                try:
                    pids = self.resolve()
                except Exception:
                    pids = self._pids
                with self._lock:
                    self._pids = pids
            self.sample()

    def sample(self) -> None:
        with self._lock:
            st = self._stats[self._phase]
            for comp, pids in self._pids.items():
                rss = [r for r in (rss_bytes(p) for p in pids) if r is not None]
                if rss:
                    st.peak_rss[comp] = max(st.peak_rss.get(comp, 0), max(rss))
                    st.peak_rss_sum[comp] = max(st.peak_rss_sum.get(comp, 0), sum(rss))
                for p in pids:
                    c = cpu_seconds(p)
                    if c is None:
                        continue
                    last = self._cpu_last.get(p, c)
                    st.cpu_s[comp] = st.cpu_s.get(comp, 0.0) + max(0.0, c - last)
                    self._cpu_last[p] = c
            load1 = os.getloadavg()[0]
            st.load1_max = max(st.load1_max, load1)
            st.load1_sum += load1
            st.samples += 1
            avail = mem_available_bytes()
            if st.min_mem_available is None or avail < st.min_mem_available:
                st.min_mem_available = avail
