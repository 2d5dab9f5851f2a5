"""Which local clusters run on this machine, and may a benchmark start another.

A benchmark's figures are only worth quoting on a quiet machine: another
cluster's control plane (its apiserver's watch caches, etcd's fsyncs, its
controllers' resyncs) takes CPU from the one measured. Clusters are counted
the way ``../shared/tools/quiet`` counts them: one running ``etcd`` process per
control plane, named by its ``--data-dir``. The counting and the decision are
pure functions over a process listing; ``process_listing`` reads /proc.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

# Set to 1 to let a benchmark start its private cluster beside running ones
# (`sandman bench --beside-other-clusters` sets it for the run).
BESIDE_ENV = "SANDMAN_BENCH_BESIDE_CLUSTERS"


@dataclass(frozen=True)
class Proc:
    """One process as /proc shows it: ``comm`` is the kernel's name for it
    (what ``pgrep -x`` matches), ``state`` the one-letter state of its stat."""

    pid: int
    comm: str
    argv: tuple[str, ...]
    state: str = "S"


@dataclass(frozen=True)
class RunningCluster:
    etcd_pid: int
    data_dir: str | None

    def describe(self) -> str:
        return f"etcd pid {self.etcd_pid}" + (f" ({self.data_dir})" if self.data_dir else "")


def _data_dir(argv: tuple[str, ...]) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith("--data-dir="):
            return arg.split("=", 1)[1]
        if arg == "--data-dir" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def running_clusters(procs: Iterable[Proc]) -> list[RunningCluster]:
    """One entry per live etcd process, in pid order. A zombie has exited
    (it only waits for its parent to reap it): it loads nothing."""
    return [
        RunningCluster(p.pid, _data_dir(p.argv))
        for p in sorted(procs, key=lambda p: p.pid)
        if p.comm == "etcd" and p.state not in ("Z", "X")
    ]


def beside_allowed(env: Mapping[str, str]) -> bool:
    return env.get(BESIDE_ENV, "").strip().lower() in ("1", "true", "yes")


def refusal(running: list[RunningCluster], *, beside: bool) -> str | None:
    """Why a benchmark must not start its own cluster now, or None when it may."""
    if beside or not running:
        return None
    names = "; ".join(c.describe() for c in running)
    return (
        f"refusing to start a private cluster beside {len(running)} running cluster(s) "
        f"({names}): their load distorts the figures. Stop them (`make down`, "
        "`sandman cluster down`), point SANDMAN_TEST_CLUSTER at one to measure on it, "
        f"or pass --beside-other-clusters ({BESIDE_ENV}=1) to measure anyway."
    )


class OtherClustersRunning(RuntimeError):
    """A benchmark would start its own cluster beside running ones."""


# -- I/O edge ---------------------------------------------------------------------


def process_listing(proc_root: Path = Path("/proc")) -> list[Proc]:
    """Every process readable under ``proc_root`` (ones that exit meanwhile are skipped)."""
    out = []
    for d in proc_root.iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            comm = (d / "comm").read_text().strip()
            stat = (d / "stat").read_text()
            state = stat.rsplit(")", 1)[1].split()[0]
            raw = (d / "cmdline").read_bytes()
            argv = tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)
            out.append(Proc(int(d.name), comm, argv, state))
    return out


def clusters_now() -> list[RunningCluster]:
    return running_clusters(process_listing())


def conditions() -> dict[str, object]:
    """The machine's load and the clusters running, for a benchmark's record."""
    return {
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "clusters_running": len(clusters_now()),
    }


def check_may_start_cluster() -> None:
    """Raise OtherClustersRunning unless a private benchmark cluster may start now."""
    why = refusal(clusters_now(), beside=beside_allowed(os.environ))
    if why:
        raise OtherClustersRunning(why)
