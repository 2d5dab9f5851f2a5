"""`sandman eval run|compare|report`: score an agent's outputs on a benchmark.

``run`` prints one line per task as it finishes (stderr) and the summary
table (stdout); the results directory keeps everything (docs/eval.md).
Exit codes: 0 every task scored; 2 some task could not be scored (an
infrastructure failure after its attempts, or a broken task): the number has
holes; 1 the run was refused (bad spec, moved run, offline tasks that would
have network, no node where the tasks' pods could run, or no dedicated node with
--require-dedicated).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from sandman.cli import durations
from sandman.cli.sandboxes import default_namespace

EXIT_OK, EXIT_REFUSED, EXIT_HOLES = 0, 1, 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ev = sub.add_parser("eval", help="score agents on a benchmark spec under controlled conditions")
    verbs = ev.add_subparsers(dest="eval_cmd", required=True)
    p = verbs.add_parser(
        "run",
        help="run every task of SPEC in a fresh sandbox and score it",
        description="Run the tasks of SPEC (YAML, or JSON lines with --jsonl or a .jsonl "
        "name) on the eval profile, one fresh sandbox per task; see docs/eval.md.",
    )
    p.add_argument("spec", type=Path, help="the spec (YAML or JSON lines)")
    p.add_argument("-o", "--out", type=Path, default=None,
                   help="results directory (default: eval-runs/SPEC-NAME-TIMESTAMP)")  # fmt: skip
    p.add_argument("--resume", action="store_true",
                   help="finish the run in --out: finished tasks are not run again")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=4, help="tasks at once (default 4)")
    p.add_argument("--attempts", type=int, default=3,
                   help="attempts per task when the infrastructure fails (default 3)")  # fmt: skip
    p.add_argument("--repeat", type=int, default=1,
                   help="run every task N times and report flaky ones (default 1)")  # fmt: skip
    p.add_argument("--profile", default="eval", help="policy profile of the sandboxes")
    p.add_argument("--start-timeout", type=durations.seconds, default=300.0,
                   help="seconds a sandbox may take to start (default 300)")  # fmt: skip
    p.add_argument("--jsonl", action="store_true", help="SPEC is JSON lines")
    p.add_argument("--allow-unverified-network", action="store_true",
                   help="run offline tasks even where a canary cannot show that "
                        "NetworkPolicy is enforced (recorded: network unverified)")  # fmt: skip
    p.add_argument("--require-dedicated", action="store_true",
                   help="refuse the run unless nodes are dedicated to the profile (labelled "
                        "and tainted sandman.dev/dedicated=PROFILE); without it a run with "
                        "none runs on shared nodes and records so")  # fmt: skip
    p.add_argument("--skip-node-check", action="store_true",
                   help="do not look at the nodes before the run (nodes an autoscaler adds "
                        "on demand); each task's node is still checked and recorded")  # fmt: skip
    p.add_argument("--insecure-registry", action="append", default=[], metavar="HOST",
                   help="plain HTTP to HOST when pinning images (loopback always is)")  # fmt: skip
    p.add_argument("--registry-endpoint", action="append", default=[], metavar="HOST=URL",
                   help="reach the registry images name HOST at URL")  # fmt: skip
    p.add_argument("-n", "--namespace", default=None, help="default: the kubeconfig's")
    p.add_argument("--kubeconfig", default=None)
    p.set_defaults(func=cmd_run)

    p = verbs.add_parser("compare", help="which tasks changed between two runs; beyond noise?")
    p.add_argument("a", type=Path, help="results directory (or results.jsonl) of run A")
    p.add_argument("b", type=Path, help="... of run B")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(func=cmd_compare)

    p = verbs.add_parser("report", help="the summary of a results directory, again")
    p.add_argument("dir", type=Path)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_report)


def _endpoints(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        host, sep, url = item.partition("=")
        if not sep or not host or not url.startswith(("http://", "https://")):
            raise SystemExit(f"sandman eval run: --registry-endpoint wants HOST=URL, got {item!r}")
        out[host] = url
    return out


def _progress(rec: dict[str, Any]) -> None:
    total = (rec.get("phases") or {}).get("total_s")
    took = f", {total:.1f}s" if total is not None else ""
    retried = f", retried {len(rec['retries'])}x" if rec.get("retries") else ""
    print(
        f"{rec['task']} r{rec['repeat']}: {rec['status']} ({rec['reason']}; "
        f"{rec['attempts']} attempt{'s' if rec['attempts'] != 1 else ''}{retried}{took})",
        file=sys.stderr,
        flush=True,
    )


def cmd_run(args: argparse.Namespace) -> int:
    from sandman.client import SandmanClient
    from sandman.eval.canary import NetworkUnverified
    from sandman.eval.network import NetworkNotIsolated
    from sandman.eval.placement import PlacementRefused
    from sandman.eval.results import ResultsDir, RunExists
    from sandman.eval.runner import EvalRun, Hooks, Options, SpecChanged
    from sandman.eval.spec import SpecError, parse_spec
    from sandman.kube_async import ApiError
    from sandman.registry import Keychain, RegistryClient

    try:
        data = args.spec.read_bytes()
        jsonl = args.jsonl or args.spec.suffix == ".jsonl"
        spec = parse_spec(data, name=args.spec.stem, jsonl=jsonl)
    except (OSError, SpecError) as e:
        print(f"sandman eval run: {args.spec}: {e}", file=sys.stderr)
        return EXIT_REFUSED
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    out = ResultsDir(args.out or Path("eval-runs") / f"{spec.name}-{stamp}")
    options = Options(
        namespace=args.namespace or default_namespace(args.kubeconfig),
        concurrency=args.concurrency, attempts=args.attempts, repeat=args.repeat,
        profile=args.profile, start_timeout_s=args.start_timeout, resume=args.resume,
        allow_unverified_network=args.allow_unverified_network,
        require_dedicated=args.require_dedicated, check_nodes=not args.skip_node_check,
    )  # fmt: skip

    async def main() -> Any:
        async with (
            SandmanClient(kubeconfig=args.kubeconfig, namespace=options.namespace) as client,
            RegistryClient(
                insecure=args.insecure_registry, endpoints=_endpoints(args.registry_endpoint)
            ) as registry,  # fmt: skip
        ):
            run = EvalRun(client, spec, out, options, registry=registry,
                          keychain=Keychain.from_docker_config_file(),
                          hooks=Hooks(on_record=_progress))  # fmt: skip
            return await run.run()

    try:
        result = asyncio.run(main())
    except (RunExists, SpecChanged, NetworkNotIsolated, NetworkUnverified, PlacementRefused,
            ValueError) as e:  # fmt: skip
        print(f"sandman eval run: refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except (ApiError, OSError) as e:
        print(f"sandman eval run: {e}", file=sys.stderr)
        return EXIT_REFUSED
    print(result.text, end="")
    print(f"results: {out.root}", file=sys.stderr)
    return EXIT_OK if result.summary["complete"] else EXIT_HOLES


def cmd_compare(args: argparse.Namespace) -> int:
    from sandman.eval.compare import compare, render_compare
    from sandman.eval.results import read_records

    try:
        a, b = read_records(args.a), read_records(args.b)
    except (OSError, ValueError, KeyError) as e:
        print(f"sandman eval compare: {e}", file=sys.stderr)
        return EXIT_REFUSED
    c = compare(a, b)
    print(json.dumps(c, indent=2) if args.json else render_compare(c, str(args.a), str(args.b)),
          end="\n" if args.json else "")  # fmt: skip
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from sandman.eval.results import ResultsDir, read_records
    from sandman.eval.summary import render_text, summarize

    try:
        records = read_records(args.dir)
        run = ResultsDir(args.dir).load_run()
    except (OSError, ValueError, KeyError) as e:
        print(f"sandman eval report: {e}", file=sys.stderr)
        return EXIT_REFUSED
    summary = summarize(records, max_attempts=int(run.get("options", {}).get("attempts", 1)))
    print(json.dumps(summary, indent=2) if args.json else render_text(summary, records), end="")
    return EXIT_OK if summary["complete"] else EXIT_HOLES
