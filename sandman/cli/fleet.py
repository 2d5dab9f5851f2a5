"""`sandman fleet run|report`: a batch of rollouts from the command line, streamed.

``run`` prints each result as one JSON line on stdout the moment its
rollout completes (pipe it into a trainer that consumes partial batches),
draws a live progress bar on stderr when that is a terminal, and ends with
the run report; ``--json``, ``--png`` and ``--trace`` keep the run for later
(``report`` re-renders saved runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from sandman.cli import durations
from sandman.cli.common import EXIT_SOME_FAILED, UsageError
from sandman.cli.sandboxes import default_namespace
from sandman.client import Sandbox, SandmanClient
from sandman.fleet.fleet import Fleet, FleetConfig, Problem
from sandman.fleet.progress import ProgressLine
from sandman.fleet.records import RolloutRecord, RunData
from sandman.fleet.report import compare_text, read_json, render_text, summarize, write_json
from sandman.fleet.strategies import STRATEGIES
from sandman.kube_async import PODS

# The progress bar's repaint loop; the bar itself limits repaints to what
# a person can follow (progress.REPAINT_S).
TICK_S = 0.1


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fleet = sub.add_parser("fleet", help="run a batch of rollouts; re-render saved runs")
    verbs = fleet.add_subparsers(dest="fleet_cmd", required=True)
    p = verbs.add_parser(
        "run",
        help="run COMMAND in a sandbox per rollout; results stream to stdout as JSON lines",
        usage="%(prog)s IMAGE [--problems N | --problems-file F] [options] -- COMMAND ...",
        description="Each rollout runs COMMAND in its sandbox with SANDMAN_PROBLEM and "
        "SANDMAN_ROLLOUT set; exit 0 is reward 1.0, any other exit 0.0.",
    )
    p.add_argument("image", nargs="?", help="the image of every problem (or --problems-file)")
    p.add_argument("--problems", type=int, default=1, help="problems p0..pN-1 (default 1)")
    p.add_argument("--problems-file", type=Path, help='JSON lines: {"id": ..., "image": ...}')
    p.add_argument("--rollouts", type=int, default=1, help="rollouts per problem (default 1)")
    p.add_argument("--strategy", choices=STRATEGIES, default="none")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--reuse", action="store_true", help="reset and reuse sandboxes per problem")
    p.add_argument(
        "--k",
        type=int,
        default=0,
        help="sandboxes per problem with --reuse (default 0: as few as fill --concurrency)",
    )
    p.add_argument(
        "--prepull",
        type=int,
        default=0,
        metavar="N",
        help="pre-pull the images of the N problems after the warm ones (docs/pools.md)",
    )
    p.add_argument(
        "--extender-url",
        default=None,
        help="sandman-scheduler's extender, asked which images a node holds already",
    )
    p.add_argument("--ttl", type=durations.lease, default="30m", help="lease (30m)")
    p.add_argument("--timeout", type=durations.seconds, default=600.0, help="per command (600s)")
    p.add_argument("--pod-command", type=shlex.split, default=None, help='e.g. "sleep infinity"')
    p.add_argument("--node-selector", action="append", default=[], metavar="K=V")
    p.add_argument("--json", type=Path, help="save the summary and the run's data")
    p.add_argument("--png", type=Path, help="the timeline plot (needs [plot])")
    p.add_argument("--trace", type=Path, help="a Chrome/Perfetto trace of the run")
    p.add_argument(
        "--api-wait",
        type=durations.seconds,
        default=60.0,
        help="give up when the apiserver does not answer for this long (60s)",
    )
    p.add_argument("--progress", choices=("auto", "always", "never"), default="auto")
    p.add_argument("-n", "--namespace", default=None, help="default: the kubeconfig's")
    p.add_argument("--kubeconfig", default=None)
    p.add_argument("--command", type=shlex.split, default=[], help="or after `--`")
    p.set_defaults(func=cmd_run)

    p = verbs.add_parser("report", help="the report of runs saved with --json")
    p.add_argument("file", type=Path)
    p.add_argument("--png", type=Path, help="the timeline plot (needs [plot])")
    p.add_argument("--trace", type=Path, help="a Chrome/Perfetto trace of the runs")
    p.set_defaults(func=cmd_report)


def result_line(rec: RolloutRecord) -> str:
    """One result as the JSON line ``run`` prints for it."""
    a = rec.final
    doc: dict[str, Any] = {
        "problem": rec.problem,
        "rollout": rec.rollout,
        "outcome": rec.outcome.value if rec.outcome else None,
        "reward": rec.reward,
        "attempts": len(rec.attempts),
        "sandbox": a.sandbox if a else None,
        "ttfc_s": None if rec.ttfc_s is None else round(rec.ttfc_s, 3),
    }
    if rec.detail:
        doc["detail"] = rec.detail
    return json.dumps(doc)


def problems_of(args: argparse.Namespace) -> list[Problem]:
    if args.problems_file is not None:
        out = []
        for n, line in enumerate(args.problems_file.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                out.append(Problem(str(doc["id"]), str(doc.get("image") or args.image), doc))
            except (ValueError, KeyError, TypeError) as e:
                raise UsageError(f"fleet run: {args.problems_file}:{n}: {e}") from None
        if any(p.image in ("", "None") for p in out):
            raise UsageError("fleet run: a problem has no image (give IMAGE or 'image')")
        return out
    if not args.image:
        raise UsageError("fleet run: give IMAGE or --problems-file")
    return [Problem(f"p{i}", args.image) for i in range(args.problems)]


def _pairs(items: list[str]) -> dict[str, str] | None:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise UsageError(f"fleet run: --node-selector wants K=V, got {item!r}")
        out[k] = v
    return out or None


def cmd_run(args: argparse.Namespace) -> int:
    if not args.command:
        raise UsageError("fleet run: give the rollout's command after `--`")
    problems = problems_of(args)
    config = FleetConfig(
        strategy=args.strategy, concurrency=args.concurrency, window=args.window,
        reuse=args.reuse, k=args.k, ttl=args.ttl, command=args.pod_command,
        node_selector=_pairs(args.node_selector), prepull_ahead=args.prepull,
        extender_url=args.extender_url, api_wait_s=args.api_wait,
    )  # fmt: skip
    namespace = args.namespace or default_namespace(args.kubeconfig)
    bar = ProgressLine(sys.stderr, force=args.progress == "always")
    bar.enabled = bar.enabled and args.progress != "never"
    command, timeout = list(args.command), args.timeout

    async def task(sb: Sandbox, problem: Problem, rollout: int) -> float:
        env = {"SANDMAN_PROBLEM": problem.id, "SANDMAN_ROLLOUT": str(rollout)}
        r = await sb.exec(command, env=env, timeout_s=timeout)
        return 1.0 if r.exit_code == 0 and not r.timed_out else 0.0

    async def main() -> RunData:
        async with SandmanClient(kubeconfig=args.kubeconfig, namespace=namespace) as client:
            # One list first: a refusal (RBAC, no such namespace, not an
            # apiserver) is said now, not after the fleet's bounded wait.
            await client.kube.list(PODS, namespace, limit=1)
            fleet = Fleet(client, config)
            painter = asyncio.create_task(_paint(fleet, bar))
            try:
                async for rec in fleet.stream(problems, args.rollouts, task):
                    print(result_line(rec), flush=True)
            finally:
                painter.cancel()
            bar.done(fleet.progress())
            return fleet.data

    data = asyncio.run(main())  # failures: main()'s one-line report, exit code 125
    summary = summarize(data)
    print(render_text(summary), end="", file=sys.stderr)
    _outputs(args, summary, data)
    return batch_exit_code(summary)


def batch_exit_code(summary: dict[str, Any]) -> int:
    """0, or 1 when a rollout ended in an infrastructure failure: not 2, which
    is a usage error, and not 125, since the batch itself ran."""
    return 0 if summary["infra_failures"] == 0 else EXIT_SOME_FAILED


async def _paint(fleet: Fleet, bar: ProgressLine) -> None:
    while bar.enabled:
        bar.update(fleet.progress())
        await asyncio.sleep(TICK_S)


def _outputs(
    args: argparse.Namespace,
    summary: dict[str, Any] | list[dict[str, Any]],
    data: RunData | list[RunData],
) -> None:
    if getattr(args, "json", None):
        print(f"run data: {write_json(args.json, summary, data)}", file=sys.stderr)
    if args.png:
        from sandman.fleet.plot import timeline_png

        try:
            print(f"timeline: {timeline_png(data, args.png)}", file=sys.stderr)
        except ImportError as e:
            print(f"error: {e}", file=sys.stderr)
    if args.trace:
        from sandman.fleet.trace import write_trace

        print(f"trace: {write_trace(data, args.trace)} (open at ui.perfetto.dev)", file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> int:
    try:
        runs = read_json(args.file)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: {args.file}: not a saved run ({e})", file=sys.stderr)
        return 1
    summaries = [s for s, _ in runs]
    if len(summaries) == 1:
        print(render_text(summaries[0]), end="")
    else:
        print(compare_text(summaries), end="")
    datas = [d for _, d in runs if d is not None]
    if (args.png or args.trace) and len(datas) != len(runs):
        print("error: the file has no run data (save it with --json)", file=sys.stderr)
        return 1
    _outputs(args, summaries, datas)
    return 0
