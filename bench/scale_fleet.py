"""An RL fleet (problems x rollouts) run while the burst loads the control plane.

The fleet's Kubernetes side is all real: its sandboxes are labeled pods
created (or warmed in pools and claimed) through the webhook and
sandman-scheduler onto kwok nodes, waited Ready and released, by the SDK and
the pool manager with the product's client (its 429 handling included).
kwok runs no containers, so no daemon answers: the commands go to a stand-in
transport (``MockTransport``) that answers ``true`` with exit 0, which is the
one part not measured here (the daemon's own benchmarks cover it).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sandman.client import Sandbox, SandmanClient
from sandman.client.transport import DaemonRequest, MockResponse, MockTransport, Target
from sandman.contract import LABEL_NODE_KIND
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, KWOK_TOLERATION
from sandman.kube_async import KubeClient


@dataclass(frozen=True)
class FleetPlan:
    kubeconfig: str
    namespace: str
    problems: int = 100
    rollouts: int = 8
    concurrency: int = 64
    strategy: str = "pipelined"  # warm pools: the pool manager is in the path too


async def _answer(target: Target, req: DaemonRequest) -> MockResponse:
    if req.path == "/v1/exec":
        return MockResponse.json(
            200,
            {
                "exit_code": 0,
                "stdout": "",
                "stderr": "",
                "timed_out": False,
                "truncated": False,
                "duration_ms": 0.1,
            },
        )
    return MockResponse.json(200, {})


async def run_fleet(plan: FleetPlan) -> dict[str, Any]:
    from sandman.fleet.fleet import Fleet, FleetConfig, Problem

    kube = KubeClient.from_kubeconfig(plan.kubeconfig, user_agent="sandman-bench-fleet")
    sdk = SandmanClient(kube=kube, namespace=plan.namespace, transport=MockTransport(_answer))
    cfg = FleetConfig(
        strategy=plan.strategy,
        concurrency=plan.concurrency,
        command=["sleep", "inf"],
        node_selector={LABEL_NODE_KIND: "kwok"},
        tolerations=[KWOK_TOLERATION],
        ttl="30m",
    )
    problems = [Problem(f"p{i}", KWOK_IMAGE) for i in range(plan.problems)]

    async def task(sb: Sandbox, problem: Problem, rollout: int) -> float:
        r = await sb.exec(["true"])
        return 1.0 if r.exit_code == 0 else 0.0

    t0 = time.time()
    async with sdk:
        data = await Fleet(sdk, cfg).run(problems, plan.rollouts, task)
    outcomes = Counter(str(r.outcome) for r in data.records)
    return {
        "rollouts": len(data.records),
        "expected": plan.problems * plan.rollouts,
        "outcomes": dict(outcomes),
        "completed": outcomes.get("ok", 0) == plan.problems * plan.rollouts,
        "wall_s": time.time() - t0,
        "pods_created": data.counters.pods_created,
        "failures": sorted({r.detail[:200] for r in data.records if str(r.outcome) != "ok"})[:5],
        "throttled": {str(k): v for k, v in kube.throttled.items()},
        "throttled_wait_s": kube.throttled_wait_s,
        "t0": t0,
        "t1": time.time(),
    }


def _main(plan: FleetPlan, out: Any) -> None:
    try:
        out.put(asyncio.run(run_fleet(plan)))
    except BaseException as e:  # reported, never a silent hole in the results
        out.put({"completed": False, "error": repr(e)})


class FleetProcess:
    def __init__(self, plan: FleetPlan) -> None:
        ctx = mp.get_context("spawn")
        self.out = ctx.Queue()
        self.proc = ctx.Process(
            target=_main, args=(plan, self.out), daemon=True, name="scale-fleet"
        )

    def start(self) -> None:
        self.proc.start()

    def result(self, timeout: float) -> dict[str, Any]:
        try:
            got: dict[str, Any] = self.out.get(timeout=timeout)
        except Exception:
            self.proc.kill()
            got = {"completed": False, "error": f"did not finish within {timeout:.0f}s"}
        self.proc.join(10)
        return got


__all__ = ["FleetPlan", "FleetProcess"]
