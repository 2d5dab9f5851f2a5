"""The reaper against the real apiserver: leases, races, dry run, stuck, HA, restarts.

Each test runs its own reaper process(es) scoped to the test's namespace
(`--watch-namespace`, lease in that namespace), so nothing else is touched.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman import tokens
from sandman.contract import (
    ANN_EXPIRES_AT,
    ANN_TTL,
    LABEL_SANDBOX,
    NAMESPACE,
    format_time,
    parse_time,
)
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import raw
from sandman.harness.testing import free_port, wait_for
from sandman.kube_async import PODS, KubeClient
from sandman.reaper.controller import Reaper, ReaperOptions
from sandman.reaper.metrics import ReaperMetrics
from sandman.tokens import AdmissionKeys


@dataclass
class ReaperProc:
    proc: subprocess.Popen[bytes]
    port: int

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
            body = r.read()
        return json.loads(body) if path != "/metrics" else body.decode()

    def ready(self) -> dict[str, Any] | None:
        try:
            return self.get("/readyz")
        except OSError:
            return None

    def reclaimed(self) -> float:
        total = 0.0
        for line in self.get("/metrics").splitlines():
            if line.startswith("sandman_reaper_reclaimed_total{") and 'dry_run="false"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture
def reapers(cluster: LocalCluster, namespace: str) -> Iterator[Any]:
    if cluster.config.deploy_sandman and cluster.config.deploy_reaper:
        pytest.skip("a cluster-wide reaper already runs on this (reused) cluster")
    started: list[ReaperProc] = []

    def start(*extra: str, watch_all: bool = False) -> ReaperProc:
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "sandman.reaper",
            "serve",
            f"--listen=127.0.0.1:{port}",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--namespace={namespace}",
            *([] if watch_all else [f"--watch-namespace={namespace}"]),
            "--lease-duration=4s",
            "--renew-deadline=3s",
            "--retry-period=1s",
            # No extension grace: a reaper on the host cannot resolve the
            # in-cluster webhook Service's name, so its probe would call the
            # webhook down and hold every lease (the grace has its own tests
            # in test_keys_and_trust.py).
            "--extension-grace=0",
            *extra,
        ]
        p = ReaperProc(
            subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port
        )
        started.append(p)
        wait_for(lambda: (p.ready() or {}).get("ok"), timeout=90, what="reaper ready")
        return p

    yield start
    for p in started:
        if p.proc.poll() is None:
            p.proc.terminate()
            p.proc.wait(10)


def sandbox(name: str, ttl: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("containers", [{"name": "main", "image": KWOK_IMAGE}])
    return {
        "metadata": {
            "name": name,
            "labels": {LABEL_SANDBOX: "true"},
            "annotations": {ANN_TTL: ttl},
        },
        "spec": on_kwok(spec),
    }


def exists(core: CoreV1Api, ns: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, ns)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def events(core: CoreV1Api, ns: str, reason: str) -> list[dict[str, Any]]:
    items = raw(core.list_namespaced_event(ns, _preload_content=False))["items"]
    return [e for e in items if e["reason"] == reason]


def test_expiry_reclaims_extension_wins_unlabeled_untouched(
    core: CoreV1Api, namespace: str, reapers: Any
) -> None:
    reapers("--no-leader-elect")
    core.create_namespaced_pod(namespace, sandbox("expires", "3s"))
    core.create_namespaced_pod(namespace, sandbox("extended", "3s"))
    # Unlabeled, with a lease annotation long past: not a sandbox, never touched.
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {
                "name": "bystander",
                "annotations": {ANN_EXPIRES_AT: "2020-01-01T00:00:00Z"},
            },
            "spec": on_kwok({"containers": [{"name": "c", "image": KWOK_IMAGE}]}),
        },
    )
    later = format_time(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10))
    core.patch_namespaced_pod(
        "extended", namespace, {"metadata": {"annotations": {ANN_EXPIRES_AT: later}}}
    )
    t0 = time.monotonic()
    wait_for(lambda: not exists(core, namespace, "expires"), timeout=90, what="reclaim")
    print(f"reclaimed {time.monotonic() - t0:.2f}s after creation with a 3 s lease")
    ev = wait_for(lambda: events(core, namespace, "LeaseExpired"), what="LeaseExpired event")
    assert ev[0]["involvedObject"]["name"] == "expires"
    # "extended"'s old deadline has passed with "expires"'s; a sandbox whose
    # lease ends after it is reclaimed only once the reaper is past it.
    core.create_namespaced_pod(namespace, sandbox("later", "1s"))
    wait_for(lambda: not exists(core, namespace, "later"), timeout=90, what="a later reclaim")
    assert exists(core, namespace, "extended") and exists(core, namespace, "bystander")


async def test_concurrent_extension_wins_over_delete(
    cluster: LocalCluster, core: CoreV1Api, namespace: str
) -> None:
    """The race, made deterministic: the lease is extended between the
    reaper's re-read and its delete; the delete's preconditions must refuse."""
    core.create_namespaced_pod(namespace, sandbox("raced", "1h"))
    due = format_time(dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1))
    core.patch_namespaced_pod(
        "raced", namespace, {"metadata": {"annotations": {ANN_EXPIRES_AT: due}}}
    )

    class Racing(KubeClient):
        async def get(self, res: Any, name: str, ns: str | None = None) -> Any:
            pod = await super().get(res, name, ns)
            if res is PODS and name == "raced":
                later = format_time(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10))
                await self.patch(
                    PODS,
                    name,
                    {"metadata": {"annotations": {ANN_EXPIRES_AT: later}}},
                    ns,
                    content_type="application/merge-patch+json",
                )
            return pod  # the reaper decides on the stale copy, as a real race would

    metrics = ReaperMetrics.create()
    async with Racing.from_kubeconfig(cluster.kubeconfig) as client:
        reaper = Reaper(
            client,
            ReaperOptions(),
            metrics,
            elector=None,
            recorder=None,
            keys=admission_keys(core),
            namespace=namespace,
        )
        await reaper.process(f"{namespace}/raced")
    assert metrics.registry.get_sample_value("sandman_reaper_conflicts_total") == 1
    assert exists(core, namespace, "raced")


def admission_keys(core: CoreV1Api) -> AdmissionKeys:
    """What the reaper verifies admission markers with (the webhook writes it)."""
    s = core.read_namespaced_secret(tokens.ADMISSION_KEY_SECRET, NAMESPACE)
    return AdmissionKeys.from_secret_data(s.data)


def dry_run_done(r: ReaperProc) -> bool:
    m = r.get("/metrics")
    counted = any(
        line.startswith("sandman_reaper_reclaimed_total{")
        and 'dry_run="true"' in line
        and float(line.rsplit(" ", 1)[1]) >= 1
        for line in m.splitlines()
    )
    return counted and "sandman_reaper_queue_depth 0.0" in m.splitlines()


def test_dry_run_deletes_nothing(core: CoreV1Api, namespace: str, reapers: Any) -> None:
    reaper = reapers("--no-leader-elect", "--dry-run")
    core.create_namespaced_pod(namespace, sandbox("kept", "1s"))
    ev = wait_for(
        lambda: events(core, namespace, "LeaseExpired"),
        timeout=90,
        what="a dry-run LeaseExpired event",
    )
    assert ev[0]["message"].startswith("dry run: would reclaim")
    # The reaper is done with it (counted as a dry-run reclaim, nothing queued).
    wait_for(lambda: dry_run_done(reaper), timeout=90, what="the dry-run reclaim counted")
    assert exists(core, namespace, "kept")


def test_stuck_pending_sandbox_is_reclaimed(core: CoreV1Api, namespace: str, reapers: Any) -> None:
    reapers("--no-leader-elect", "--stuck-pending=3s")
    pod = sandbox("nowhere", "1h")
    pod["spec"]["nodeSelector"]["no-such-node"] = "true"  # can never schedule
    core.create_namespaced_pod(namespace, pod)
    wait_for(lambda: not exists(core, namespace, "nowhere"), timeout=90, what="stuck reclaim")
    ev = events(core, namespace, "StuckReclaimed")
    assert ev and "unschedulable" in ev[0]["message"]


def test_two_reapers_one_acts_and_the_standby_takes_over(
    core: CoreV1Api, namespace: str, reapers: Any
) -> None:
    a, b = reapers(), reapers()
    leader = wait_for(
        lambda: [r for r in (a, b) if (r.ready() or {}).get("leader")], timeout=90, what="a leader"
    )
    assert len(leader) == 1
    leader_proc = leader[0]
    standby = b if leader_proc is a else a
    core.create_namespaced_pod(namespace, sandbox("first", "1s"))
    wait_for(lambda: not exists(core, namespace, "first"), timeout=90, what="first reclaim")
    assert (leader_proc.reclaimed(), standby.reclaimed()) == (1, 0)

    os.kill(leader_proc.proc.pid, signal.SIGKILL)  # no clean lease release
    for i in range(5):
        core.create_namespaced_pod(namespace, sandbox(f"meanwhile-{i}", "1s"))
    # Lease 4 s: the standby takes over within a few seconds and catches up.
    wait_for(
        lambda: all(not exists(core, namespace, f"meanwhile-{i}") for i in range(5)),
        timeout=90,
        what="the standby reclaiming what expired meanwhile",
    )
    assert standby.reclaimed() == 5
    assert (standby.ready() or {}).get("leader") is True


def test_restart_mid_burst_loses_no_deadline(core: CoreV1Api, namespace: str, reapers: Any) -> None:
    first = reapers("--no-leader-elect")
    names = [f"burst-{i}" for i in range(30)]
    for i, name in enumerate(names):
        core.create_namespaced_pod(namespace, sandbox(name, f"{1 + i % 6}s"))
    wait_for(lambda: first.reclaimed() >= 1, timeout=90, what="the first reaper at work")
    os.kill(first.proc.pid, signal.SIGKILL)
    # More leases end while no reaper runs: wait until every one has.
    leases = [
        parse_time(p.metadata.annotations[ANN_EXPIRES_AT])
        for p in core.list_namespaced_pod(namespace).items
        if p.metadata.name in names
    ]
    wait_for(
        lambda: not leases or dt.datetime.now(dt.UTC) > max(leases),
        timeout=90,
        what="every lease ended while no reaper runs",
    )
    reapers("--no-leader-elect")
    wait_for(
        lambda: all(not exists(core, namespace, n) for n in names),
        timeout=90,
        what="every burst sandbox reclaimed across the restart",
    )
