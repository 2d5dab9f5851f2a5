"""`sandman demo`: a small batch of SWE-style rollouts on the local cluster.

N sandboxes of the `swe` task image start together; each runs the task's
failing test, half of them apply the one-line fix, all run the test again,
and the report shows rewards and the start-up phases. What `make up` ends
with, so a fresh machine shows the whole path working.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from sandman.client import Sandbox, SandboxStartError, SandmanClient
from sandman.contract import LABEL_NODE_KIND
from sandman.harness.cluster.config import default_state_dir
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.images.build import ImageBuilder
from sandman.harness.images.recipes import SWE_BUGGY_LINE, SWE_FIXED_LINE


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="run a demo batch of sandboxes on the local cluster")
    p.add_argument("--sandboxes", type=int, default=8)
    p.add_argument("--state-dir", type=Path, default=None)
    p.add_argument("--namespace", default="default")
    p.set_defaults(func=cmd_demo)


async def _rollout(client: SandmanClient, image: str, fix: bool) -> tuple[float, dict[str, float]]:
    async with await Sandbox.create(
        client,
        image,
        command=["sleep", "3600"],
        ttl="15m",
        node_selector={LABEL_NODE_KIND: "real"},
    ) as sb:
        before = await sb.exec(["python3", "-m", "unittest"], cwd="/work/repo")
        assert before.exit_code == 1, before.stderr
        if fix:
            src = (await sb.read_file("/work/repo/calc/ops.py")).decode()
            await sb.write_file(
                "/work/repo/calc/ops.py", src.replace(SWE_BUGGY_LINE, SWE_FIXED_LINE)
            )
        after = await sb.exec(["python3", "-m", "unittest"], cwd="/work/repo")
        phases = {k: v for k, v in sb.timings.phases().items() if v is not None}
        return (1.0 if after.exit_code == 0 else 0.0), phases


def cmd_demo(args: argparse.Namespace) -> int:
    cluster = LocalCluster.at(default_state_dir() if args.state_dir is None else args.state_dir)
    node = cluster.real_node
    if node is None:
        print(
            "error: the demo needs the real node: sandman cluster up --real-node --deploy",
            file=sys.stderr,
        )
        return 1
    image = ImageBuilder(cluster.config.cache_dir).build_and_push("swe", node.registry).ref

    async def main() -> int:
        async with SandmanClient(kubeconfig=cluster.kubeconfig, namespace=args.namespace) as client:
            t0 = time.monotonic()
            print(
                f"demo: {args.sandboxes} rollouts of {image} (half of them fix the bug)",
                file=sys.stderr,
            )
            results = await asyncio.gather(
                *(_rollout(client, image, fix=i % 2 == 0) for i in range(args.sandboxes)),
                return_exceptions=True,
            )
            wall = time.monotonic() - t0
        ok = [r for r in results if not isinstance(r, BaseException)]
        failed = [r for r in results if isinstance(r, BaseException)]
        rewards = [r[0] for r in ok]
        ttfc = [r[1]["ttfc_s"] for r in ok if "ttfc_s" in r[1]]
        print(f"rollouts: {len(ok)} ok, {len(failed)} failed; rewards {rewards}")
        if ttfc:
            print(
                f"time to first command: p50 {statistics.median(ttfc):.2f}s, "
                f"max {max(ttfc):.2f}s; batch wall time {wall:.1f}s"
            )
        for e in failed:
            kind = (
                f"{e.reason} (retryable={e.retryable})"
                if isinstance(e, SandboxStartError)
                else repr(e)
            )
            print(f"  failed: {kind}", file=sys.stderr)
        expected = [1.0 if i % 2 == 0 else 0.0 for i in range(args.sandboxes)]
        return 0 if not failed and sorted(rewards) == sorted(expected) else 1

    return asyncio.run(main())
