"""`sandman bench NAME [--json FILE]`: run a benchmark from bench/."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

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


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="run a benchmark (brings up the cluster it needs)")
    bsub = p.add_subparsers(dest="bench_name", required=True)
    for name, module in BENCHMARKS.items():
        mod = importlib.import_module(module)
        bp = bsub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        bp.add_argument("--json", type=Path, default=None, help="write results as JSON here")
        mod.add_args(bp)
        bp.set_defaults(func=_runner(name, module))
    allp = bsub.add_parser("all", help="every benchmark with default settings")
    allp.add_argument("--json", type=Path, default=None, help="write results as JSON here")
    allp.set_defaults(func=run_all)


def _runner(name: str, module: str):  # type: ignore[no-untyped-def]
    def run(args: argparse.Namespace) -> int:
        from sandman.bench.report import write_json

        results = importlib.import_module(module).run(args)
        if args.json:
            write_json(args.json, name, results)
            print(f"wrote {args.json}", file=sys.stderr)
        return 0

    return run


def run_all(args: argparse.Namespace) -> int:
    from sandman.bench.report import write_json

    combined = {}
    for name, module in BENCHMARKS.items():
        mod = importlib.import_module(module)
        p = argparse.ArgumentParser()
        mod.add_args(p)
        combined[name] = mod.run(p.parse_args([]))
    if args.json:
        write_json(args.json, "all", combined)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
