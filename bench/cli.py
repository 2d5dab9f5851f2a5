"""`sandman bench NAME [--json FILE]`: run a benchmark from bench/."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sandman.harness.cluster.running import BESIDE_ENV

# name -> module under sandman.bench (the repo's bench/ folder)
BENCHMARKS = {
    "cluster": "sandman.bench.cluster",
    "daemon": "sandman.bench.daemon",
    "reset": "sandman.bench.reset",
    "webhook": "sandman.bench.webhook",
    "reaper": "sandman.bench.reaper",
    "extender": "sandman.bench.extender",
    "realnode": "sandman.bench.realnode",
    "rollout": "sandman.bench.rollout",
    "gvisor": "sandman.bench.gvisor",
    "controller": "sandman.bench.controller",
    "podstart": "sandman.bench.podstart",
    "claim": "sandman.bench.claim",
    "density": "sandman.bench.density",
    "scale": "sandman.bench.scale",
    "memory": "sandman.bench.scale_memory",
    "peer": "sandman.bench.peer",
}


BESIDE_HELP = (
    "start a private cluster even while other clusters run on this machine "
    "(their load distorts the figures; also SANDMAN_BENCH_BESIDE_CLUSTERS=1)"
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="run a benchmark (brings up the cluster it needs)")
    bsub = p.add_subparsers(dest="bench_name", required=True)
    for name, module in BENCHMARKS.items():
        mod = importlib.import_module(module)
        bp = bsub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        bp.add_argument("--json", type=Path, default=None, help="write results as JSON here")
        bp.add_argument("--beside-other-clusters", action="store_true", help=BESIDE_HELP)
        mod.add_args(bp)
        bp.set_defaults(func=_runner(name, module))
    allp = bsub.add_parser("all", help="every benchmark with default settings")
    allp.add_argument("--json", type=Path, default=None, help="write results as JSON here")
    allp.add_argument("--beside-other-clusters", action="store_true", help=BESIDE_HELP)
    allp.set_defaults(func=run_all)


@contextlib.contextmanager
def _beside(allowed: bool) -> Iterator[None]:
    """The flag as the env var the cluster-starting paths read (bench_bed, and
    benchmarks that start their own), for this run only."""
    if not allowed:
        yield
        return
    old = os.environ.get(BESIDE_ENV)
    os.environ[BESIDE_ENV] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(BESIDE_ENV, None)
        else:
            os.environ[BESIDE_ENV] = old


def _guarded(name: str, args: argparse.Namespace, body: Callable[[], dict[str, Any]]) -> int:
    """Run a benchmark so that SIGTERM/Ctrl-C tear down the cluster it started
    (bench/interrupt.py), refuse to start one beside other clusters, and record
    the machine's load and clusters at its start and end with its results."""
    from sandman.bench.interrupt import Interrupted, raising_on_signals
    from sandman.bench.report import write_json
    from sandman.harness.cluster import running

    with _beside(getattr(args, "beside_other_clusters", False)), raising_on_signals():
        try:
            start = running.conditions()
            results = body()
            end = running.conditions()
        except Interrupted as e:
            msg = f"sandman bench {name}: {e}; stopped what it started, no results"
            print(msg, file=sys.stderr)
            return e.exit_code
        except running.OtherClustersRunning as e:
            print(f"sandman bench {name}: {e}", file=sys.stderr)
            return 3
    if args.json:
        write_json(args.json, name, results, conditions={"start": start, "end": end})
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _runner(name: str, module: str):  # type: ignore[no-untyped-def]
    def run(args: argparse.Namespace) -> int:
        return _guarded(name, args, lambda: importlib.import_module(module).run(args))

    return run


def run_all(args: argparse.Namespace) -> int:
    def body() -> dict[str, Any]:
        combined = {}
        for name, module in BENCHMARKS.items():
            mod = importlib.import_module(module)
            p = argparse.ArgumentParser()
            mod.add_args(p)
            combined[name] = mod.run(p.parse_args([]))
        return combined

    return _guarded("all", args, body)
