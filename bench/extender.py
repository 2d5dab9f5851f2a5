"""`sandman bench extender`: what the extender costs, and what it saves.

1. /prioritize latency: an extender process serving a synthetic index of
   5,000 nodes and 10,000 tracked images, asked sequentially (as the scheduler
   does) for realistic sandbox pods with 1,000 and 5,000 candidate nodes over
   loopback HTTP; p50/p99 as the client sees them.
2. Placement study, both variants in one run on the same workload: the RL
   batch (500 task images x 4 rollouts, at most 64 sandboxes at once) on 10
   simulated nodes with limited image disk. A real kube-scheduler decides every
   placement: once with a plain profile (what the default scheduler does), once
   with the extender. Pulls are not performed but modeled from the decisions
   (``extender_model``); the bench plays the kubelets, so the schedulers and the
   extender see the modeled world: node.status.images lists what the modeled
   disk holds, and a pod stays bound-but-not-started for exactly its modeled
   pull.

The two studies live in ``extender_latency`` and ``extender_placement`` (its
model of pulls in ``extender_model``); this module is their entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

from sandman.bench.extender_latency import latency_study
from sandman.bench.extender_placement import placement_study
from sandman.bench.report import table
from sandman.harness.testing import bench_bed


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--images", type=int, default=500, help="task images (problems)")
    p.add_argument("--rollouts", type=int, default=4, help="sandboxes per image")
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=64, help="sandboxes alive at once")
    p.add_argument("--disk-gb", type=float, default=40.0, help="image disk per node")
    p.add_argument("--pull-mbps", type=float, default=16.0, help="pull+unpack MB/s per node")
    p.add_argument("--image-gb", type=float, nargs=2, default=(1.0, 3.0), metavar=("MIN", "MAX"))
    p.add_argument("--run-s", type=float, default=120.0, help="modeled sandbox run time")
    p.add_argument("--start-s", type=float, default=2.0, help="modeled start with image present")
    p.add_argument("--settle-ms", type=float, default=20.0, help="watch catch-up per batch")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--latency-requests", type=int, default=400)
    p.add_argument("--tracked-images", type=int, default=10_000)
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--skip-placement", action="store_true")


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    if not args.skip_latency:
        results |= latency_study(args)
    if not args.skip_placement:
        bed = bench_bed(need_real_node=False)
        try:
            with tempfile.TemporaryDirectory(prefix="sandman-bench-extender-") as tmp:
                results |= asyncio.run(placement_study(bed.cluster, args, Path(tmp)))
        finally:
            bed.close()
    shown = [(k, v) for k, v in results.items() if isinstance(v, int | float)]
    print(table("extender", shown))
    return results
