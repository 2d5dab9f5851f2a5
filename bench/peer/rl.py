"""The RL batch row: P problems x R rollouts at concurrency C, reuse on, both systems.

Ours: the fleet (``sandman.fleet``) with no pools and reuse on, the task of
``sandman bench rollout``'s real scenario. The peer: the recycling of its RL
example (``agent_sandbox_rl/recycle.py``) driven through its CRDs: a
template and a shallow warm pool (one sandbox) per problem image made up
front, a problem's rollouts run one after another in one claimed sandbox with
a reset between them (the temporary directories wiped and every process the
rollout started killed, then checked), the problem's pool dropped while its
sandbox is held, up to C problems at once. Commands go through the
apiserver's exec, as its handles do. The same task runs on both: a reward of
1 only if the sandbox was pristine.

The peer's git-restore step is left out: the task image has no git checkout,
so there the example would fall back to a fresh claim per rollout; the
recycling is modelled with the reset that does apply (the wipe and the kill).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from sandman.bench.peer import objects as peer
from sandman.bench.peer.rows import COMMAND, READY_TIMEOUT_S, Side, peer_template
from sandman.bench.rollout import real_task
from sandman.client import SandmanClient
from sandman.fleet.fleet import Fleet, FleetConfig, Problem
from sandman.fleet.report import summarize
from sandman.kube_async import ApiError

EXIT = "; echo EXIT=$?"
PIDS = "ls /proc | grep -E '^[0-9]+$'"


@dataclass
class RLResult:
    pods_created: int
    wall_s: float
    rewards: list[float]
    failures: int

    def as_json(self) -> dict[str, Any]:
        return {
            "pods_created": self.pods_created,
            "wall_s": round(self.wall_s, 2),
            "rollouts": len(self.rewards),
            "reward_mean": round(sum(self.rewards) / len(self.rewards), 4)
            if self.rewards
            else None,
            "failures": self.failures,
        }


async def ours_rl(
    client: SandmanClient, side: Side, problems: list[Problem], rollouts: int, concurrency: int
) -> RLResult:
    cfg = FleetConfig(
        strategy="none",
        reuse=True,
        concurrency=concurrency,
        command=COMMAND,
        node_selector=side.node_selector,
        tolerations=side.tolerations or None,
    )
    data = await Fleet(client, cfg).run(problems, rollouts, real_task)
    s = summarize(data)
    rewards = [r.reward for r in data.records if r.reward is not None]
    return RLResult(
        pods_created=int(s["pods_created"]),
        wall_s=float(s["wall_s"]),
        rewards=rewards,
        failures=len(data.records) - len(rewards),
    )


async def _sh(side: Side, pod: str, script: str) -> tuple[int, str]:
    out = await side.api_exec.run(side.namespace, pod, ["sh", "-c", script + EXIT])
    body, _, code = out.rpartition("EXIT=")
    try:
        return int(code.strip()), body
    except ValueError:
        return 255, out


async def peer_task(side: Side, pod: str, problem: Problem, rollout: int) -> float:
    """``real_task`` through the apiserver's exec."""
    code, _ = await _sh(side, pod, "test ! -e /tmp/mark && cat /problem")
    await _sh(side, pod, f"echo {problem.id}/{rollout} > /tmp/mark")
    await _sh(side, pod, "sleep 300 >/dev/null 2>&1 &")
    _, total = await _sh(side, pod, "seq 1 100 | awk '{s+=$1} END {print s}'")
    return 1.0 if code == 0 and total.strip() == "5050" else 0.0


def _reset_script(baseline: str) -> str:
    keep = " ".join(baseline.split())
    return (
        "rm -rf /tmp/* /tmp/.[!.]* /var/tmp/* 2>/dev/null; "
        f"for p in $({PIDS}); do case ' {keep} ' in *\" $p \"*) ;; "
        '*) [ "$p" != "$$" ] && kill -9 "$p" 2>/dev/null ;; esac; done; '
        'test -z "$(ls -A /tmp)"'
    )


async def _claim(side: Side, pool: str) -> tuple[str, str]:
    name = side.name("rl")
    await side.kube.create(peer.CLAIMS, peer.claim(name, pool), side.namespace)
    await side.claims.wait(name, READY_TIMEOUT_S)
    sb_name = peer.claimed_sandbox(side.claims.last[name])
    if sb_name is None:
        raise RuntimeError(f"claim {name} Ready without a sandbox")
    sb = side.sandboxes.last.get(sb_name) or await side.kube.get(
        peer.SANDBOXES, sb_name, side.namespace
    )
    return name, peer.sandbox_pod(sb)


async def _delete(side: Side, res: Any, name: str) -> None:
    try:
        await side.kube.delete(res, name, side.namespace, propagationPolicy="Background")
    except ApiError as e:
        if not e.not_found:
            raise


async def peer_rl(
    side: Side,
    problems: list[Problem],
    rollouts: int,
    concurrency: int,
    max_reuses: int = 8,
) -> RLResult:
    seen_before = set(side.pods.last)
    t0 = time.monotonic()
    names = {p.id: f"rl-{p.id}-{side.name('t')[-8:]}" for p in problems}
    for p in problems:  # the example's "naive" warming: every image's pool, up front
        tpl = peer_template(side)
        tpl["spec"]["containers"][0]["image"] = p.image
        await side.kube.create(
            peer.TEMPLATES, peer.sandbox_template(names[p.id], tpl), side.namespace
        )
        await side.kube.create(
            peer.WARMPOOLS, peer.warm_pool(names[p.id], names[p.id], 1), side.namespace
        )
    sem = asyncio.Semaphore(concurrency)
    rewards: list[float] = []
    failures = 0

    async def group(p: Problem) -> None:
        nonlocal failures
        async with sem:
            claim_name, pod = await _claim(side, names[p.id])
            # Holding it: drop the pool so it does not refill (the example's scale_on_hold).
            await _delete(side, peer.WARMPOOLS, names[p.id])
            _, baseline = await _sh(side, pod, PIDS)
            uses = 0
            try:
                for r in range(rollouts):
                    try:
                        rewards.append(await peer_task(side, pod, p, r))
                    except Exception:
                        failures += 1
                    if r == rollouts - 1:
                        break
                    uses += 1
                    clean = False
                    if uses < max_reuses:
                        code, _ = await _sh(side, pod, _reset_script(baseline))
                        clean = code == 0
                    if not clean:  # rotation or quarantine: a fresh claim, its pool re-warmed
                        await _delete(side, peer.CLAIMS, claim_name)
                        await side.kube.create(
                            peer.WARMPOOLS,
                            peer.warm_pool(names[p.id], names[p.id], 1),
                            side.namespace,
                        )
                        claim_name, pod = await _claim(side, names[p.id])
                        await _delete(side, peer.WARMPOOLS, names[p.id])
                        _, baseline = await _sh(side, pod, PIDS)
                        uses = 0
            finally:
                await _delete(side, peer.CLAIMS, claim_name)

    results = await asyncio.gather(*(group(p) for p in problems), return_exceptions=True)
    failures += sum(rollouts for r in results if isinstance(r, BaseException))
    wall = time.monotonic() - t0
    for p in problems:
        await _delete(side, peer.TEMPLATES, names[p.id])
    created = set(side.pods.last) - seen_before
    return RLResult(pods_created=len(created), wall_s=wall, rewards=rewards, failures=failures)
