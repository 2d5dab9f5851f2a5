"""Faults injected during the burst: each component killed once, the apiserver restarted.

Every fault is a real one: a component is ended with SIGKILL (no graceful
shutdown, requests in flight die with it) and comes back the way it would in
production: in-cluster the kubelet restarts the container (the process is
found on the real node by its pod's UID in its cgroup); as a host process the
bench restarts it after ``down_s``, standing in for the kubelet. The
apiserver (always a host process here) is stopped and started again.

Each fault returns a ``Window``: from the kill to the moment the component
(or a replacement: the reaper's standby taking the Lease) serves again.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.client import CoordinationV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.bench.scale_ledger import Window
from sandman.bench.scale_metrics import cmdline, pids_of_pod
from sandman.contract import NAMESPACE
from sandman.harness.cluster import reaper as reaper_proc
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.process import ManagedProcess, wait_healthy
from sandman.harness.kube import api_client, raw
from sandman.harness.probes import http_ok, insecure_context
from sandman.harness.testing import free_port

FAULTS = ("webhook", "extender", "reaper-leader", "apiserver")
# How long a killed host process stays down before the bench restarts it: the
# kubelet restarts a crashed container at once the first time, then backs off
# from 10 s; 5 s sits between and makes the outage long enough to matter.
DOWN_S = 5.0
RECOVER_TIMEOUT_S = 180.0
REAPER_LEASE = "sandman-reaper"
# In-cluster component -> (pod label, what its command line contains).
IN_CLUSTER = {
    "webhook": ("sandman-webhook", "webhook serve"),
    "extender": ("sandman-scheduler", "extender serve"),
    "scheduler": ("sandman-scheduler", "kube-scheduler"),
    "reaper": ("sandman-reaper", "reaper serve"),
}
# ... and its container's name in the pod (manifests/*/deployment.yaml).
CONTAINERS = {"webhook": "webhook", "extender": "extender", "reaper": "reaper"}


def _wait(pred: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not come back within {timeout:.0f}s")


def plan_points(seed: int, faults: tuple[str, ...] = FAULTS) -> dict[str, float]:
    """A random point in the burst for each fault: fractions of its creates seen,
    in [0.1, 0.85], at least 0.1 apart (one outage is over before the next)."""
    rng = random.Random(seed)
    while True:
        pts = sorted(rng.uniform(0.1, 0.85) for _ in faults)
        if all(b - a >= 0.1 for a, b in itertools.pairwise(pts)) or len(pts) < 2:
            order = list(faults)
            rng.shuffle(order)
            return dict(zip(order, pts, strict=True))


@dataclass
class HostReaper:
    """A reaper the bench runs as a host process (a standby, or the test's pair)."""

    identity: str
    port: int
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None

    def start(self, log: Path) -> None:
        with open(log, "ab") as f:
            self.proc = subprocess.Popen(
                self.argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )

    def ready(self) -> bool:
        try:
            return http_ok(reaper_proc.url(self.port, "/readyz"))
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


class Reapers:
    """The reapers that compete for one Lease: the deployed ones and any the bench adds."""

    def __init__(
        self,
        cluster: LocalCluster,
        lease_ns: str = NAMESPACE,
        lease_name: str = REAPER_LEASE,
        own: list[HostReaper] | None = None,
    ) -> None:
        self.cluster = cluster
        self.lease_ns, self.lease_name = lease_ns, lease_name
        self.own = own or []
        self.coord = CoordinationV1Api(api_client(cluster.kubeconfig))

    @classmethod
    def host_pair(
        cls, cluster: LocalCluster, namespace: str, log_dir: Path, extra: tuple[str, ...] = ()
    ) -> Reapers:
        """Two host reapers scoped to ``namespace`` with a Lease of their own
        (test sessions deploy none)."""
        lease = f"sandman-reaper-{namespace}"[:63]
        own = []
        for k in range(2):
            port = free_port()
            ident = f"bench-reaper-{k}"
            argv = reaper_proc.serve_argv(
                port,
                cluster.kubeconfig,
                extra=[
                    f"--watch-namespace={namespace}",
                    f"--lease-name={lease}",
                    f"--identity={ident}",
                    *extra,
                ],
            )
            own.append(HostReaper(ident, port, argv))
        r = cls(cluster, NAMESPACE, lease, own)
        for k, h in enumerate(own):
            h.start(log_dir / f"reaper-{k}.log")
        return r

    def holder(self) -> str:
        lease = self.coord.read_namespaced_lease(self.lease_name, self.lease_ns)
        return lease.spec.holder_identity or ""

    def wait_leader(self, timeout: float = 60.0) -> str:
        _wait(self.holder, timeout, "a reaper leader")
        return self.holder()

    def kill_leader(self, down_s: float) -> tuple[str, float]:
        """SIGKILL the leader's process; returns (its identity, kill time)."""
        who = self.holder()
        mine = next((h for h in self.own if h.identity == who), None)
        t = time.time()
        if mine is not None:
            mine.kill()
            time.sleep(down_s)
            mine.start(Path(self.cluster.layout.logs) / f"{who}.log")
            return who, t
        if self.cluster.config.sandman_mode == "in-cluster":
            kill_in_pod(self.cluster, "reaper", pod_name=who)
            return who, t
        # The deployment's host reaper: identity "<hostname>-<pid>".
        pid = int(who.rsplit("-", 1)[1])
        os.kill(pid, signal.SIGKILL)
        time.sleep(down_s)
        proc = _host_process(self.cluster, "sandman-reaper")
        proc.start()
        return who, t

    def wait_leading_again(self, killed_at: float, timeout: float = RECOVER_TIMEOUT_S) -> str:
        """Until a live reaper renewed the Lease after ``killed_at`` (the killed one
        cannot): the standby once the Lease expired, or the restarted replica,
        which keeps its identity (a pod's name) and takes its Lease back."""

        def renewed() -> bool:
            lease = self.coord.read_namespaced_lease(self.lease_name, self.lease_ns)
            t = lease.spec.renew_time
            return t is not None and t.timestamp() > killed_at and bool(lease.spec.holder_identity)

        # A renewal the killed leader sent just before it died may still land:
        # only one well after the kill (a leader renews every 2 s) proves a
        # live one leads.
        killed_at += 3.0
        _wait(renewed, timeout, "a reaper leading again")
        return self.holder()

    def stop(self) -> None:
        for h in self.own:
            h.stop()


def _host_process(cluster: LocalCluster, name: str) -> ManagedProcess:
    return next(p for p in cluster.processes() if p.name == name)


def component_pods(cluster: LocalCluster, app: str) -> list[dict[str, Any]]:
    core = CoreV1Api(api_client(cluster.kubeconfig))
    pods = raw(
        core.list_namespaced_pod(
            NAMESPACE, label_selector=f"app.kubernetes.io/name={app}", _preload_content=False
        )
    )["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def kill_in_pod(cluster: LocalCluster, component: str, *, pod_name: str | None = None) -> str:
    """SIGKILL ``component``'s process in one of its pods (the named one, else
    the first Ready one), and wait until the kubelet has restarted the
    container and the pod is Ready again. Returns the pod's name."""
    app, needle = IN_CLUSTER[component]
    pods = component_pods(cluster, app)
    if pod_name is not None:
        pods = [p for p in pods if p["metadata"]["name"] == pod_name] or pods
    pods = [p for p in pods if _ready(p)] or pods
    if not pods:
        raise RuntimeError(f"no {app} pod to kill")
    pod = pods[0]
    name = str(pod["metadata"]["name"])
    before = _restarts(pod, CONTAINERS[component])
    pids = [p for p in pids_of_pod(pod["metadata"]["uid"]) if needle in cmdline(p)]
    if not pids:
        raise RuntimeError(f"no {needle!r} process of pod {name} on this host")
    for pid in pids:
        os.kill(pid, signal.SIGKILL)

    def back() -> bool:
        now = next((p for p in component_pods(cluster, app) if p["metadata"]["name"] == name), None)
        return now is not None and _restarts(now, CONTAINERS[component]) > before and _ready(now)

    _wait(back, RECOVER_TIMEOUT_S, f"{component} in {name}")
    return name


def _restarts(pod: dict[str, Any], container: str) -> int:
    for cs in (pod.get("status") or {}).get("containerStatuses") or ():
        if cs.get("name") == container:
            return int(cs.get("restartCount", 0))
    return 0


def _ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


class Chaos:
    """The four faults on one cluster (either deployment mode)."""

    def __init__(self, cluster: LocalCluster, reapers: Reapers, down_s: float = DOWN_S) -> None:
        self.cluster = cluster
        self.reapers = reapers
        self.down_s = down_s
        self.in_cluster = cluster.config.sandman_mode == "in-cluster"

    def inject(self, fault: str) -> tuple[Window, str]:
        fn = {
            "webhook": self.kill_webhook,
            "extender": self.kill_extender,
            "reaper-leader": self.kill_reaper_leader,
            "apiserver": self.restart_apiserver,
        }[fault]
        t0 = time.time()
        detail = fn()
        return Window(fault, t0, time.time()), detail

    def kill_webhook(self) -> str:
        dep = self.cluster.deployment
        assert dep is not None
        if self.in_cluster:
            pod = kill_in_pod(self.cluster, "webhook")
            return f"killed the webhook in {pod}; the kubelet restarted it"
        proc = _host_process(self.cluster, "sandman-webhook")
        pid = proc.running_pid()
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        time.sleep(self.down_s)
        dep.start_webhook()  # starts, waits healthy, proves injection
        return f"killed the only webhook (pid {pid}), restarted after {self.down_s:.0f}s"

    def kill_extender(self) -> str:
        if self.in_cluster:
            pod = kill_in_pod(self.cluster, "extender", pod_name=_scheduler_leader(self.cluster))
            return f"killed the extender of the leading scheduler {pod}; restarted"
        proc = _host_process(self.cluster, "sandman-extender")
        pid = proc.running_pid()
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        time.sleep(self.down_s)
        proc.start()
        dep = self.cluster.deployment
        assert dep is not None
        wait_healthy(
            proc,
            dep.health_checks()[proc.name],
            timeout_s=RECOVER_TIMEOUT_S,
            progress=lambda _m: None,
        )
        return f"killed the extender (pid {pid}), restarted after {self.down_s:.0f}s"

    def kill_reaper_leader(self) -> str:
        who, killed_at = self.reapers.kill_leader(self.down_s)
        new = self.reapers.wait_leading_again(killed_at)
        return f"killed the reaper leader {who}; {new} renewed the Lease"

    def restart_apiserver(self) -> str:
        proc = _host_process(self.cluster, "kube-apiserver")
        proc.stop()
        proc.start()
        ctx = insecure_context()
        _wait(lambda: http_ok(f"{self.cluster.server}/readyz", context=ctx), 120, "the apiserver")
        return "stopped and started the apiserver"


def _scheduler_leader(cluster: LocalCluster) -> str | None:
    """The sandman-scheduler pod holding its Lease (identity: "<pod>_<uuid>")."""
    coord = CoordinationV1Api(api_client(cluster.kubeconfig))
    try:
        lease = coord.read_namespaced_lease("sandman-scheduler", NAMESPACE)
    except ApiException:
        return None
    holder = lease.spec.holder_identity or ""
    return holder.split("_", 1)[0] or None


__all__ = ["FAULTS", "Chaos", "HostReaper", "Reapers", "plan_points"]
