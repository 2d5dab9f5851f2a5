"""`sandman bench scale`: >12,000 sandboxes held and a 30,000-create burst, chaos included.

On a cluster with kwok nodes (``--pods-per-node`` each, 110 as a kubelet) and
Sandman in the path (webhook, sandman-scheduler + extender, reaper; in-cluster
on the real node when it is free, host processes otherwise):

- **held**: N labeled sandboxes created in bursts by several client processes
  through admission and the scheduler, all held Ready for ``--hold`` seconds
  while a lease keeper extends their leases, then their leases end on a
  schedule (``--reclaim-window``) and the reaper reclaims them;
- **burst**: B creates as fast as the clients issue them, each with a short
  lease the reaper ends; with ``--chaos`` the serving webhook replica, the
  extender and the reaper leader are killed and the apiserver restarted, each
  once at a random point; with the fleet (default on) an RL batch of
  problems x rollouts runs through the SDK and pools at the same time.

Afterwards the bench proves from its own record of every pod and lease
(``scale_ledger``): zero wrong deletions, zero sandboxes without the daemon
and the policy defaults, every lease that ended reclaimed. Per phase: create
and scheduling rates and latencies, admission latency, time to all-Ready,
reclaim latency, apiserver 429/5xx, webhook rejections, peak RSS and CPU of
every component. Results: docs/scale.md.
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from pathlib import Path
from typing import Any

from sandman.bench.report import table
from sandman.bench.scale_chaos import Chaos, plan_points
from sandman.bench.scale_clients import ClientFleet
from sandman.bench.scale_env import ScaleEnv, open_env
from sandman.bench.scale_fleet import FleetPlan, FleetProcess
from sandman.bench.scale_leases import LeaseKeeper, final_ends
from sandman.bench.scale_ledger import STUCK_PENDING_S, Ledger, PodRecord, read_events
from sandman.bench.scale_metrics import delta
from sandman.bench.scale_report import (
    admission_figures,
    during,
    invariants,
    pod_figures,
    reclaim_figures,
    resource_figures,
    scheduler_figures,
    table_rows,
)
from sandman.bench.scale_watch import Tail

POLL_S = 1.0
HOLD_POLL_S = 5.0  # how often the hold counts the held sandboxes


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sandboxes", type=int, default=12_500, help="held phase (0: skip)")
    p.add_argument("--burst", type=int, default=30_000, help="burst creates (0: skip)")
    p.add_argument("--hold", type=float, default=300.0, help="seconds all sandboxes are held")
    p.add_argument("--lease", type=float, default=180.0, help="held leases, kept this far ahead")
    p.add_argument(
        "--renew-at",
        type=float,
        default=0.5,
        help="a held lease is moved a whole --lease ahead when less than this fraction is left"
        " (the extension rate is N / (lease x (1 - renew-at)) patches/s)",
    )
    p.add_argument("--burst-lease", type=int, default=120, help="seconds (the ttl annotation)")
    p.add_argument(
        "--reclaim-window",
        type=float,
        default=None,
        help="seconds over which held leases end (default: N / 40, under the reaper's 50/s)",
    )
    p.add_argument(
        "--burst-rate",
        type=float,
        default=None,
        help="creates/s of the burst in all (default: as fast as the clients go); with --chaos"
        " a small burst needs it to outlast the four faults (~30 s each)",
    )
    p.add_argument(
        "--held-rate",
        type=float,
        default=None,
        help="creates/s of the held phase in all (default: as fast as the clients go); on a"
        " small machine, what the node simulator can make Ready (else pods wait Pending until"
        " the reaper's stuck rule takes them)",
    )
    p.add_argument(
        "--reaper-stuck-after",
        type=float,
        default=None,
        help="seconds a sandbox may stay never-Ready before the reaper's stuck rule takes it"
        " (in-cluster: the reaper is restarted with it; default: the reaper's 10 min). For a"
        " machine whose node simulator lags creates by more than that",
    )
    p.add_argument("--processes", type=int, default=4, help="client processes")
    p.add_argument("--concurrency", type=int, default=32, help="creates in flight per process")
    p.add_argument("--pods-per-node", type=int, default=110)
    p.add_argument("--bystanders", type=int, default=100, help="pods that must survive")
    p.add_argument("--chaos", action="store_true", help="kill each component once mid-burst")
    p.add_argument("--seed", type=int, default=None, help="chaos points (default: random)")
    p.add_argument("--no-fleet", action="store_true", help="no RL fleet during the burst")
    p.add_argument("--fleet-problems", type=int, default=100)
    p.add_argument("--fleet-rollouts", type=int, default=8)
    p.add_argument("--fleet-concurrency", type=int, default=64)
    p.add_argument("--settle", type=float, default=600.0, help="max seconds to wait per wait")
    p.add_argument("--state-dir", type=Path, default=None, help="a running cluster to use")
    p.add_argument("--host-components", action="store_true", help="Sandman as host processes")
    p.add_argument("--run-dir", type=Path, default=None, help="where the event files go")
    p.add_argument("--keep", action="store_true", help="leave pods, nodes and cluster")


def settled(r: PodRecord) -> bool:
    """Nothing more to wait for: Ready, or already being deleted (a short
    burst lease can end before a slow scheduler placed the pod: waiting for
    its Ready would wait out ``--settle`` for nothing)."""
    return bool(r.uid) and (r.ready_at is not None or r.deleting_at is not None)


def _wait(env: ScaleEnv, tail: Tail, pred: Any, timeout: float) -> Ledger:
    deadline = time.monotonic() + timeout
    ledger = tail.read()
    while not pred(ledger) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        ledger = tail.read()
    return ledger


def _snapshot(env: ScaleEnv) -> dict[str, Any]:
    env.scrape()
    return {
        "api": env.apiserver.totals(),
        "webhook": env.webhook.totals(),
        "scheduler": env.scheduler.totals(),
        "extender": env.extender.totals(),
        "t": time.time(),
    }


def _phase_metrics(env: ScaleEnv, before: dict[str, Any], names: list[str]) -> dict[str, Any]:
    after = _snapshot(env)
    stats = env.sampler.phases()
    return {
        **admission_figures(
            delta(after["api"], before["api"]), delta(after["webhook"], before["webhook"])
        ),
        **scheduler_figures(
            delta(after["scheduler"], before["scheduler"]),
            delta(after["extender"], before["extender"]),
        ),
        **resource_figures([stats[n] for n in names if n in stats]),
    }


def held_phase(env: ScaleEnv, args: argparse.Namespace, tail: Tail) -> dict[str, Any]:
    n = args.sandboxes
    env.phase("held-create")
    before = _snapshot(env)
    keeper = LeaseKeeper(
        env.kubeconfig,
        env.namespace,
        env.run_dir,
        "held-",
        args.lease,
        env.event,
        renew_at=args.renew_at,
    )
    keeper.start()
    clients = ClientFleet.split(
        kubeconfig=env.kubeconfig,
        namespace=env.namespace,
        prefix="held-",
        count=n,
        processes=args.processes,
        concurrency=args.concurrency,
        ttl_s=int(args.lease),
        out_dir=env.run_dir,
        rate=args.held_rate,
    )
    clients.start()
    env.name_processes("bench-clients", [p.pid for p in clients.procs])
    tally = clients.join()
    held = lambda r: r.name.startswith("held-")  # noqa: E731
    ledger = _wait(
        env,
        tail,
        lambda L: L.count(lambda r: held(r) and settled(r)) >= tally["created"] + tally["existed"],
        args.settle,
    )
    env.phase("held-hold")
    hold_start = time.time()
    hold_end = hold_start + args.hold
    names = sorted(
        (r.name for r in ledger.sandboxes() if held(r) and r.uid),
        key=lambda s: int(s.split("-")[1]),
    )
    window = args.reclaim_window or max(30.0, len(names) / 40.0)
    # Each lease ends at its planned point after the hold, or where it already
    # is if that is later: a lease is never shortened (the ledger counts the
    # latest end a pod had), and waiting for one lease past every current one
    # would leave all N idle for a whole lease after the hold.
    current = {r.name: r.lease_end or 0.0 for r in ledger.sandboxes() if held(r)}
    final = {
        n: max(end, math.ceil(current.get(n, 0.0)))
        # From a poll after the hold's end: the held count is taken at the
        # first poll past it (HOLD_POLL_S), before any planned end.
        for n, end in final_ends(names, hold_end + 2 * HOLD_POLL_S, window).items()
    }
    keeper.set_final(final)
    alive_min = len(names)
    while time.time() < hold_end:
        time.sleep(HOLD_POLL_S)
        ledger = tail.read()
        alive = ledger.count(lambda r: held(r) and r.ready_at and r.deleting_at is None)
        alive_min = min(alive_min, alive)
    ledger = tail.read()
    held_now = ledger.count(lambda r: held(r) and r.ready_at and r.deleting_at is None)
    stored = env.etcd_object_bytes(names[:: max(1, len(names) // 20)])
    env.phase("held-reclaim")
    last_end = max(final.values(), default=hold_end)
    ledger = _wait(
        env,
        tail,
        lambda L: L.count(lambda r: held(r) and r.deleting_at) >= len(names),
        last_end - time.time() + args.settle,
    )
    keeper.stop()
    env.phase("between")
    figures = _phase_metrics(env, before, ["held-create", "held-hold", "held-reclaim"])
    figures["cpu_ms_per_sandbox"] = per_sandbox_ms(figures["cpu_s"], len(names))
    return {
        "held_sandboxes": held_now,
        "held_min_during_hold": alive_min,
        "hold_s": args.hold,
        "reclaim_window_s": window,
        # A held sandbox as etcd stores it (mean of up to 20, protobuf).
        "etcd_bytes_per_sandbox": round(sum(stored) / len(stored)) if stored else None,
        "extensions_sent": keeper.sent,
        "extensions_failed": keeper.failed,
        "client": tally,
        **pod_figures(ledger, held),
        **reclaim_figures(ledger, held),
        **figures,
    }


def _chaos_runner(
    env: ScaleEnv, tail_dir: Path, burst: int, seed: int | None
) -> tuple[threading.Thread, list[dict[str, Any]]]:
    seed = seed if seed is not None else int(time.time())
    points = plan_points(seed)
    chaos = Chaos(env.cluster, env.reapers)
    done: list[dict[str, Any]] = []

    def run() -> None:
        tail = Tail(tail_dir, "watch.jsonl")
        for fault, frac in sorted(points.items(), key=lambda kv: kv[1]):
            while tail.read().count(lambda r: r.name.startswith("burst-")) < frac * burst:
                time.sleep(0.2)
            try:
                win, detail = chaos.inject(fault)
            except Exception as e:  # recorded: a fault that could not be made proves nothing
                done.append({"fault": fault, "at": frac, "error": repr(e)})
                continue
            env.event({"ev": "chaos", "what": fault, "start": win.start, "end": win.end})
            done.append(
                {
                    "fault": fault,
                    "at": round(frac, 2),
                    "detail": detail,
                    "recovered_s": round(win.end - win.start, 1),
                    "start": win.start,
                    "end": win.end,
                }
            )

    th = threading.Thread(target=run, daemon=True, name="scale-chaos")
    th.start()
    done.append({"seed": seed})
    return th, done


def burst_phase(env: ScaleEnv, args: argparse.Namespace, tail: Tail) -> dict[str, Any]:
    b = args.burst
    env.phase("burst")
    before = _snapshot(env)
    fleet = None
    if not args.no_fleet:
        fleet_ns = f"{env.namespace}-fleet"
        env.core().create_namespace({"metadata": {"name": fleet_ns}})
        fleet = FleetProcess(
            FleetPlan(
                str(env.kubeconfig),
                fleet_ns,
                args.fleet_problems,
                args.fleet_rollouts,
                args.fleet_concurrency,
            )
        )
    chaos_thread, chaos = (None, [])
    if args.chaos:
        chaos_thread, chaos = _chaos_runner(env, env.run_dir, b, args.seed)
    clients = ClientFleet.split(
        kubeconfig=env.kubeconfig,
        namespace=env.namespace,
        prefix="burst-",
        count=b,
        processes=args.processes,
        concurrency=args.concurrency,
        ttl_s=args.burst_lease,
        out_dir=env.run_dir,
        rate=args.burst_rate,
    )
    if fleet is not None:
        fleet.start()
        env.name_processes("bench-fleet", [fleet.proc.pid])
    clients.start()
    env.name_processes("bench-clients", [p.pid for p in clients.procs])
    tally = clients.join()
    burst = lambda r: r.name.startswith("burst-")  # noqa: E731
    _wait(
        env,
        tail,
        lambda L: L.count(lambda r: burst(r) and settled(r)) >= tally["created"] + tally["existed"],
        args.settle,
    )
    fleet_result = fleet.result(args.settle) if fleet is not None else None
    if chaos_thread is not None:
        chaos_thread.join(args.settle)
    env.phase("burst-reclaim")
    ledger = _wait(
        env,
        tail,
        lambda L: (
            L.count(lambda r: burst(r) and r.deleting_at) >= tally["created"] + tally["existed"]
        ),
        args.burst_lease + args.settle,
    )
    env.phase("after")
    for c in chaos:
        if "start" in c:
            c["during"] = during(ledger, c["start"], c["end"])
    figures = _phase_metrics(env, before, ["burst", "burst-reclaim"])
    # The fleet's pods went through the same path in the same phase.
    pods = tally["created"] + tally["existed"] + int((fleet_result or {}).get("pods_created", 0))
    figures["cpu_ms_per_sandbox"] = per_sandbox_ms(figures["cpu_s"], pods)
    return {
        "client": tally,
        "chaos": chaos,
        "fleet": fleet_result,
        **pod_figures(ledger, burst),
        **reclaim_figures(ledger, burst),
        **figures,
    }


# Pods of the fleet alive at once, per unit of its concurrency: the rollouts'
# sandboxes, the warm pools' next ones, and those still terminating on kwok
# (a deleted pod keeps its node's slot until kwok has deleted it).
FLEET_PODS_PER_SLOT = 4


def capacity_needed(args: argparse.Namespace) -> int:
    """Pod slots the kwok nodes must have. The burst and the fleet run at once;
    too few slots made pods unschedulable and the scheduler's backoff looked
    like slow scheduling (2,199 unschedulable attempts in a 500-pod chaos run
    with the fleet, before the fleet was counted here)."""
    fleet = 0 if args.no_fleet or not args.burst else FLEET_PODS_PER_SLOT * args.fleet_concurrency
    return max(args.sandboxes, args.burst + fleet) + args.bystanders


def run(args: argparse.Namespace) -> dict[str, Any]:
    pods = capacity_needed(args)
    env = open_env(
        state_dir=args.state_dir,
        host_components=args.host_components,
        pods=pods,
        per_node=args.pods_per_node,
        run_dir=args.run_dir,
    )
    results: dict[str, Any] = {
        "mode": env.cluster.config.sandman_mode,
        "run_dir": str(env.run_dir),
        "nodes": len(env.nodes),
    }
    try:
        if args.reaper_stuck_after:
            if env.cluster.config.sandman_mode != "in-cluster" or env.deployment is None:
                raise SystemExit("--reaper-stuck-after: only with Sandman in-cluster")
            after = f"{int(args.reaper_stuck_after)}s"
            env.deployment.add_reaper_args(f"--stuck-pending={after}", f"--stuck-not-ready={after}")
            results["reaper_stuck_after_s"] = int(args.reaper_stuck_after)
        tail = Tail(env.run_dir)
        if args.bystanders:
            # Not sandboxes, with a lease long past: they must outlive the run.
            ClientFleet.split(
                kubeconfig=env.kubeconfig,
                namespace=env.namespace,
                prefix="bystander-",
                count=args.bystanders,
                processes=1,
                concurrency=8,
                ttl_s=1,
                out_dir=env.run_dir,
                kind="bystander",
            ).run_all()
        if args.sandboxes:
            results["held"] = held_phase(env, args, tail)
        if args.burst:
            results["burst"] = burst_phase(env, args, tail)
        time.sleep(2)
        ledger = Ledger().extend(read_events(*sorted(env.run_dir.glob("*.jsonl"))))
        results["invariants"] = invariants(
            ledger,
            time.time(),
            grace_s=30.0,
            stuck_after_s=args.reaper_stuck_after or STUCK_PENDING_S,
        )
        results["etcd_db_mib"] = round(
            sum(v for (n, _), v in env.etcd_last.items() if n == "etcd_mvcc_db_total_size_in_bytes")
            / (1 << 20),
            1,
        )
    finally:
        env.close(keep=args.keep)
    out = headline(results)
    print(table("scale", table_rows(out)))
    print(json.dumps({k: out[k] for k in HEADLINE if k in out}, indent=1))
    return out


HEADLINE = (
    "held_sandboxes",
    "burst_creates",
    "burst_create_rate",
    "admission_p99_ms_under_burst",
    "schedule_p99_ms_under_burst",
    "reclaim_p99_s_at_scale",
    "wrong_deletions",
    "sandboxes_without_daemon",
    "component_peak_rss_mib",
)


def per_sandbox_ms(cpu_s: dict[str, float], pods: int) -> dict[str, float]:
    """CPU milliseconds each component spent per sandbox of a phase (each one
    admitted, scheduled, started by kwok, watched and reclaimed)."""
    return {k: round(v * 1000 / pods, 1) for k, v in cpu_s.items()} if pods else {}


def headline(results: dict[str, Any]) -> dict[str, Any]:
    held = results.get("held") or {}
    burst = results.get("burst") or {}
    inv = results.get("invariants") or {}
    rss: dict[str, float] = {}
    for ph in (held, burst):
        for k, v in (ph.get("peak_rss_mib") or {}).items():
            rss[k] = max(rss.get(k, 0.0), v)
    return {
        "held_sandboxes": held.get("held_sandboxes", 0),
        "burst_creates": burst.get("created", 0),
        "burst_create_rate": burst.get("create_rate"),
        "admission_p99_ms_under_burst": burst.get("admission_p99_ms"),
        "schedule_p99_ms_under_burst": burst.get("schedule_p99_ms"),
        "reclaim_p99_s_at_scale": held.get("reclaim_p99_s"),
        "wrong_deletions": inv.get("wrong_deletions"),
        "sandboxes_without_daemon": inv.get("sandboxes_without_daemon"),
        "component_peak_rss_mib": rss,
        **results,
    }
