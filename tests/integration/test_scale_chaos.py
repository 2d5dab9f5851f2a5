"""Chaos during a burst of sandbox creates, at small scale: the invariants hold.

The scale bench's parts (``sandman.bench.scale_*``) on the session cluster:
client processes create sandboxes with short leases on kwok nodes through
the webhook and sandman-scheduler while one fault is injected a third of the
way in; two reapers (leader-elected, scoped to this module's namespace) reclaim
the leases as they end; a list-then-watch recorder keeps the bench's own
record. Each step then proves, from that record: zero wrong deletions (no
bystander deleted, no sandbox deleted before its lease ended), zero sandboxes
without the injected daemon and the policy defaults, every lease that ended
reclaimed, no create lost; plus what that fault is about.

The timing of the fault is the one thing not pinned: everything is waited on
as conditions, never slept on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import CoreV1Api

from sandman.bench.scale_chaos import Chaos, Reapers
from sandman.bench.scale_clients import ClientFleet
from sandman.bench.scale_ledger import (
    Ledger,
    Window,
    read_events,
    unreclaimed,
    without_daemon,
    wrong_deletions,
)
from sandman.bench.scale_watch import Tail, WatchProcess
from sandman.contract import LABEL_BENCH, NAMESPACE
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.testing import wait_for

PODS = 60  # per step: 4 steps and the bystanders make ~250 pods
LEASE_S = 15  # short, so the reapers reclaim every step's sandboxes within it
# Creates per second: the burst lasts ~30 s, so that the fault (a third of the
# way in, as the watch sees it) meets creates still to come even when the
# watch lags the clients by seconds (at 4/s a loaded machine's lag let every
# create through before the fault, and no create met it).
RATE = 2.0
BYSTANDERS = 5


@dataclass
class Bed:
    cluster: LocalCluster
    namespace: str
    run_dir: Path
    reapers: Reapers
    chaos: Chaos
    watch: WatchProcess


@pytest.fixture(scope="module")
def bed(
    cluster: LocalCluster, core: CoreV1Api, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bed]:
    ns = f"t-scale-chaos-{int(time.time()) % 100000}"
    core.create_namespace({"metadata": {"name": ns, "labels": {LABEL_BENCH: "scale"}}})
    run_dir = tmp_path_factory.mktemp("scale-chaos")
    # The session deploys no reaper: a pair of our own, leader-elected. No
    # extension grace: their webhook probe could not resolve the in-cluster
    # Service name from the host, and no lease here is extended.
    reapers = Reapers.host_pair(cluster, ns, run_dir, ("--extension-grace=0",))
    watch = WatchProcess(cluster.kubeconfig, ns, run_dir / "watch.jsonl")
    try:
        wait_for(lambda: all(h.ready() for h in reapers.own), timeout=120, what="reapers ready")
        reapers.wait_leader()
        watch.start()
        ClientFleet.split(
            kubeconfig=cluster.kubeconfig,
            namespace=ns,
            prefix="bystander-",
            count=BYSTANDERS,
            processes=1,
            concurrency=4,
            ttl_s=1,
            out_dir=run_dir,
            kind="bystander",
        ).run_all(timeout=120)
        yield Bed(cluster, ns, run_dir, reapers, Chaos(cluster, reapers), watch)
    finally:
        watch.stop()
        reapers.stop()
        core.delete_namespace(ns)


@dataclass
class Step:
    ledger: Ledger
    window: Window
    detail: str
    tally: dict[str, Any]
    prefix: str

    def mine(self) -> list[Any]:
        return [r for r in self.ledger.sandboxes() if r.name.startswith(self.prefix)]


def run_step(bed: Bed, fault: str) -> Step:
    """A burst of PODS creates with ``fault`` injected once a third were seen;
    returns once every created sandbox was Ready and then reclaimed."""
    prefix = f"{fault}-"
    clients = ClientFleet.split(
        kubeconfig=bed.cluster.kubeconfig,
        namespace=bed.namespace,
        prefix=prefix,
        count=PODS,
        processes=2,
        concurrency=8,
        ttl_s=LEASE_S,
        out_dir=bed.run_dir,
        rate=RATE,
    )
    tail = Tail(bed.run_dir)
    clients.start()
    wait_for(
        lambda: tail.read().count(lambda r: r.name.startswith(prefix)) >= PODS // 3,
        timeout=180,
        what=f"a third of the {fault} step's creates",
    )
    window, detail = bed.chaos.inject(fault)
    tally = clients.join(timeout=600)
    created = tally["created"] + tally["existed"]
    wait_for(
        lambda: tail.read().count(lambda r: r.name.startswith(prefix) and r.ready_at) >= created,
        timeout=300,
        what="every sandbox of the step Ready",
    )
    wait_for(
        lambda: tail.read().count(lambda r: r.name.startswith(prefix) and r.deleting_at) >= created,
        timeout=300,
        what="every sandbox of the step reclaimed",
    )
    ledger = Ledger().extend(read_events(*sorted(bed.run_dir.glob("*.jsonl"))))
    return Step(ledger, window, detail, tally, prefix)


def assert_invariants(step: Step) -> None:
    led = step.ledger
    assert wrong_deletions(led) == [], "a pod was deleted that nobody may delete"
    assert without_daemon(led) == [], "a sandbox exists without the daemon or a default"
    assert unreclaimed(led, now=time.time(), grace_s=30) == []
    assert step.tally["lost"] == 0 and step.tally["refused"] == {}, step.tally
    assert len(step.mine()) == PODS and all(r.uid for r in step.mine())
    # The bystanders (no label, a lease of 2020) are all still there.
    bystanders = [r for r in led.pods.values() if r.kind == "bystander"]
    assert len(bystanders) == BYSTANDERS and all(r.deleting_at is None for r in bystanders)


def test_killing_the_serving_webhook_lets_no_sandbox_through(bed: Bed) -> None:
    step = run_step(bed, "webhook")
    assert_invariants(step)
    if bed.cluster.config.sandman_mode == "host":
        # The only replica was down for seconds: creates in that time were
        # refused (failurePolicy Fail), resent, and admitted once it was back.
        assert step.tally["retries"] > 0, step.tally


def test_scheduling_goes_on_while_the_extender_is_gone(bed: Bed) -> None:
    step = run_step(bed, "extender")
    assert_invariants(step)
    w = step.window
    bound_meanwhile = [r for r in step.mine() if r.bound_at and w.start <= r.bound_at <= w.end]
    assert bound_meanwhile, f"nothing was bound while the extender was down ({step.detail})"
    # What makes it so: sandman-scheduler calls the extender as ignorable.
    assert all(e["ignorable"] for e in scheduler_extenders(bed.cluster))


def test_the_reaper_leader_killed_mid_burst_is_replaced(bed: Bed) -> None:
    step = run_step(bed, "reaper-leader")
    assert_invariants(step)
    ended_after_kill = [r for r in step.mine() if r.lease_end and r.lease_end > step.window.start]
    assert ended_after_kill and all(r.deleting_at for r in ended_after_kill)


def test_an_apiserver_restart_loses_no_create(bed: Bed) -> None:
    step = run_step(bed, "apiserver")
    assert_invariants(step)
    assert step.tally["retries"] > 0, "no create met the restart"


def scheduler_extenders(cluster: LocalCluster) -> list[dict[str, Any]]:
    """sandman-scheduler's extenders as configured (ConfigMap in-cluster, file on the host)."""
    if cluster.config.sandman_mode == "in-cluster":
        cm = cluster.core().read_namespaced_config_map("sandman-scheduler", NAMESPACE)
        doc = yaml.safe_load(cm.data["config.yaml"])
    else:
        doc = yaml.safe_load((cluster.layout.config_dir / "sandman-scheduler.yaml").read_text())
    return list(doc.get("extenders") or [])
