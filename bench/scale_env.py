"""The scale bench's test bed: a cluster with Sandman, kwok nodes, a namespace,
the watch, the reapers, the samplers; and the scrapes of Prometheus text.

The cluster is a private one (its own state dir and ports, the real node when
this machine's is free: Sandman in-cluster, else host processes) or, with
``--state-dir``, a running one of the caller's. Never the default (`make up`)
cluster: a scale run fills it with tens of thousands of pods.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import ssl
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml
from kubernetes.client import CoreV1Api

from sandman.bench.scale_chaos import IN_CLUSTER, HostReaper, Reapers, component_pods
from sandman.bench.scale_metrics import (
    Sample,
    Sampler,
    cmdline,
    descendants,
    parse_prometheus,
    pids_of_pod,
)
from sandman.bench.scale_watch import WatchProcess
from sandman.contract import LABEL_BENCH, NAMESPACE
from sandman.harness.cluster import reaper as reaper_proc
from sandman.harness.cluster import running
from sandman.harness.cluster.config import ClusterConfig, KwokNodeShape, Ports, RealNodeConfig
from sandman.harness.cluster.kwok_nodes import is_ready, kwok_node
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.process import ManagedProcess
from sandman.harness.kube import api_client, raw
from sandman.harness.probes import insecure_context
from sandman.harness.testing import free_port, real_node_reason_for_new_cluster, wait_for
from sandman.kube_async import load_credentials

NODE_PREFIX = "scale-node-"
# Prometheus series the bench keeps from each scrape (everything else is dropped).
APISERVER_SERIES = (
    "apiserver_request_total",
    "apiserver_admission_webhook_admission_duration_seconds",
    "apiserver_admission_webhook_rejection_count",
    "apiserver_admission_webhook_request_total",
    "apiserver_flowcontrol_rejected_requests_total",
)
WEBHOOK_SERIES = ("sandman_webhook_admission_duration_seconds", "sandman_webhook_admissions_total")
ETCD_SERIES = ("etcd_mvcc_db_total_size_in_bytes", "etcd_server_quota_backend_bytes")
# sandman-scheduler's view of each pod: queue entry -> bound (SLI), the
# serial part (filter + score + our extender's prioritize), the Bind call.
SCHEDULER_SERIES = (
    "scheduler_pod_scheduling_sli_duration_seconds",
    "scheduler_scheduling_algorithm_duration_seconds",
    "scheduler_framework_extension_point_duration_seconds",
    "scheduler_schedule_attempts_total",
)
EXTENDER_SERIES = ("sandman_extender_request_duration_seconds",)


def pods_per_node_nodes(pods: int, per_node: int) -> int:
    """Nodes for ``pods`` at ``per_node`` each, with 5% to spare (the scheduler
    spreads, and a node the bench still fills must not be the one that blocks)."""
    return max(1, -(-int(pods * 1.05) // per_node))


def _get(url: str, context: ssl.SSLContext | None = None, timeout: float = 10.0) -> str | None:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as r:
            return str(r.read().decode())
    except (OSError, ValueError):
        return None


class CounterTracker:
    """Counter increases between scrapes, across restarts of the scraped process
    (a counter that went down was reset: its new value is all increase).
    Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: Sample = {}
        self._sum: Sample = {}
        self._seeded = False

    def add(self, sample: Sample) -> None:
        with self._lock:
            for k, v in sample.items():
                last = self._last.get(k)
                # The first scrape is the baseline; a series that appears later
                # started from 0 since then (the apiserver creates series
                # lazily; a restarted replica starts anew); a counter that went
                # down was reset.
                fresh = v if self._seeded else 0.0
                inc = fresh if last is None else (v - last if v >= last else v)
                self._sum[k] = self._sum.get(k, 0.0) + inc
                self._last[k] = v
            self._seeded = True

    def totals(self) -> Sample:
        with self._lock:
            return dict(self._sum)


@dataclass
class ScaleEnv:
    cluster: LocalCluster
    owned: bool
    namespace: str
    run_dir: Path
    nodes: list[str]
    watch: WatchProcess
    reapers: Reapers
    sampler: Sampler
    bench_out: IO[str]
    apiserver: CounterTracker = field(default_factory=CounterTracker)
    webhook: CounterTracker = field(default_factory=CounterTracker)
    scheduler: CounterTracker = field(default_factory=CounterTracker)
    extender: CounterTracker = field(default_factory=CounterTracker)
    etcd_last: Sample = field(default_factory=dict)
    roles: dict[int, str] = field(default_factory=dict)  # the bench's processes (resolver)
    # Read once: LocalCluster.processes() and .deployment compute the daemon
    # image's content key, hashing source trees (~0.5 s of CPU a call); asked
    # every few seconds by the sampler and the scrapes, that made the bench's
    # main process the third biggest CPU user of a run.
    procs: list[ManagedProcess] = field(default_factory=list)
    deployment: Any = None
    # One TLS context each for the whole run (a new one loads the CA store).
    tls: dict[str, Any] = field(default_factory=dict)
    _scraper: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _out_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    def core(self) -> CoreV1Api:
        return CoreV1Api(api_client(self.kubeconfig))

    def event(self, ev: dict[str, Any]) -> None:
        ev.setdefault("src", "bench")
        ev.setdefault("t", time.time())
        line = json.dumps(ev, separators=(",", ":")) + "\n"
        with self._out_lock:
            self.bench_out.write(line)
            self.bench_out.flush()

    def name_processes(self, role: str, pids: list[int | None]) -> None:
        """Count these processes' CPU and memory as ``role`` (bench-clients, ...)."""
        for pid in pids:
            if pid is not None:
                self.roles[pid] = role

    def phase(self, name: str) -> None:
        self.event({"ev": "phase", "name": name})
        self.sampler.mark(name)

    # -- scrapes ---------------------------------------------------------------------
    def scrape(self) -> None:
        """One scrape of the apiserver, etcd and every webhook replica (errors skipped:
        a component being restarted by the chaos has no metrics for a moment)."""
        creds = self.tls["apiserver"]
        text = _get(f"{creds.server}/metrics", creds.ssl)
        if text is not None:
            self.apiserver.add(parse_prometheus(text, APISERVER_SERIES))
        text = _get(f"http://127.0.0.1:{self.cluster.config.ports.etcd_client}/metrics")
        if text is not None:
            self.etcd_last = parse_prometheus(text, ETCD_SERIES)
        url = self._scheduler_metrics_url()
        if url is not None:
            text = _get(url, self.tls["client-cert"])
            if text is not None:
                sample = parse_prometheus(text, SCHEDULER_SERIES)
                self.scheduler.add(
                    {
                        k: v
                        for k, v in sample.items()
                        if not k[0].startswith("scheduler_framework")
                        or ("extension_point", "Bind") in k[1]
                    }
                )
        dep = self.deployment
        if dep is None:
            return
        for comp, series, tracker in (
            ("webhook", WEBHOOK_SERIES, self.webhook),
            ("extender", EXTENDER_SERIES, self.extender),
        ):
            merged: Sample = {}
            try:
                urls = dep.metrics_urls(comp)
            except Exception:
                continue
            for url in urls:
                text = _get(url, self.tls["insecure"])
                for k, v in parse_prometheus(text or "", series).items():
                    # One series per replica: the URL keeps them apart.
                    merged[(k[0], k[1] | {("instance", url)})] = v
            tracker.add(merged)

    def etcd_object_bytes(self, names: list[str]) -> list[int]:
        """The stored size (protobuf, as the apiserver wrote it) of these pods of
        the bench's namespace in etcd, read through etcd's JSON gateway."""
        port = self.cluster.config.ports.etcd_client
        out = []
        for name in names:
            key = base64.b64encode(f"/registry/pods/{self.namespace}/{name}".encode()).decode()
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v3/kv/range",
                data=json.dumps({"key": key}).encode(),
                method="POST",
            )
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    kvs = json.loads(r.read()).get("kvs") or []
            except (OSError, ValueError):
                continue
            if kvs:
                out.append(len(base64.b64decode(kvs[0].get("value", ""))))
        return out

    def _scheduler_metrics_url(self) -> str | None:
        """sandman-scheduler's /metrics as a host process (in-cluster: not scraped)."""
        for p in self.procs:
            if p.name == "sandman-scheduler":
                port = next(
                    (a.split("=", 1)[1] for a in p.argv if a.startswith("--secure-port=")), None
                )
                return f"https://127.0.0.1:{port}/metrics" if port else None
        return None

    def start_scraping(self, period: float = 5.0) -> None:
        def loop() -> None:
            while not self._stop.wait(period):
                self.scrape()

        self.scrape()
        self._scraper = threading.Thread(target=loop, daemon=True, name="scale-scrape")
        self._scraper.start()

    # -- teardown --------------------------------------------------------------------
    def close(self, keep: bool = False) -> None:
        self._stop.set()
        self.sampler.stop()
        self.watch.stop()
        self.reapers.stop()
        self.bench_out.close()
        core = self.core()
        if not keep:
            for ns in (self.namespace, f"{self.namespace}-fleet"):  # the fleet's (scale.py)
                with contextlib.suppress(Exception):
                    core.delete_namespace(ns)
            for n in self.nodes:
                with contextlib.suppress(Exception):
                    core.delete_node(n)
        if self.owned:
            self.cluster.down(purge=not keep)


def _client_cert_context(kubeconfig: Path) -> ssl.SSLContext:
    """The kubeconfig's client certificate, the peer's not verified: for the
    schedulers' /metrics (self-signed serving certificates, delegated authn)."""
    doc = yaml.safe_load(Path(kubeconfig).read_text())
    user = doc["users"][0]["user"]
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with tempfile.TemporaryDirectory() as d:
        cert, key = Path(d) / "c", Path(d) / "k"
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        ctx.load_cert_chain(cert, key)
    return ctx


def open_cluster(state_dir: Path | None, host_components: bool) -> tuple[LocalCluster, bool]:
    """(cluster, owned): a running cluster at ``state_dir``, else a new private one."""
    if state_dir is not None:
        cluster = LocalCluster.at(state_dir)
        if cluster.config.sandman_mode is None:
            raise RuntimeError(f"the cluster at {state_dir} runs no Sandman (up --deploy)")
        if not cluster.status().running:
            raise RuntimeError(f"the cluster at {state_dir} is not running")
        return cluster, False
    running.check_may_start_cluster()  # another cluster's load would be measured too
    state = Path(tempfile.mkdtemp(prefix="sandman-bench-scale-"))
    no_real = "host components asked for" if host_components else None
    no_real = no_real or real_node_reason_for_new_cluster(state)
    cfg = dataclasses.replace(
        ClusterConfig(state_dir=state),
        ports=Ports.free(),
        kwok_nodes=0,
        real_node=RealNodeConfig(enabled=no_real is None),
        deploy_sandman=True,
        deploy_reaper=True,
        host_components=host_components,
        start_timeout_s=180.0,
    )
    cluster = LocalCluster(cfg)
    try:
        cluster.up()
    except BaseException:
        cluster.down(purge=True)
        raise
    return cluster, True


def add_nodes(core: CoreV1Api, count: int, per_node: int, tag: str) -> list[str]:
    """``count`` kwok nodes of ``per_node`` pods each, Ready when this returns."""
    shape = KwokNodeShape(cpu="1000", memory="4Ti", pods=per_node)
    names = [f"{NODE_PREFIX}{tag}-{i}" for i in range(count)]
    for n in names:
        core.create_node(kwok_node(n, shape, labels={LABEL_BENCH: "scale"}))

    def ready() -> bool:
        items = raw(core.list_node(label_selector=f"{LABEL_BENCH}=scale", _preload_content=False))[
            "items"
        ]
        return sum(1 for i in items if i["metadata"]["name"] in set(names) and is_ready(i)) >= count

    wait_for(ready, timeout=300, what=f"{count} kwok nodes Ready")
    return names


def resolver(
    cluster: LocalCluster, procs: list[ManagedProcess], reapers: Reapers, roles: dict[int, str]
) -> Any:
    """component -> its processes on this host, in either deployment mode.
    ``roles`` names the bench's own processes (pid -> bench-clients, ...) as
    the bench starts them; the rest of the bench is bench-main."""
    host = {
        "etcd": "etcd",
        "kube-apiserver": "kube-apiserver",
        "kube-controller-manager": "kube-controller-manager",
        "kube-scheduler": "default-scheduler",
        "kwok": "kwok",
        "sandman-webhook": "webhook",
        "sandman-extender": "extender",
        "sandman-scheduler": "scheduler",
        "sandman-reaper": "reaper",
    }

    def resolve() -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        cluster_pids: set[int] = set()
        for p in procs:
            comp = host.get(p.name)
            pid = p.running_pid()
            if pid is not None:
                cluster_pids.add(pid)
            if comp and pid is not None:
                out.setdefault(comp, []).append(pid)
        for h in reapers.own:
            if h.proc is not None and h.proc.poll() is None:
                out.setdefault("reaper", []).append(h.proc.pid)
        if cluster.config.sandman_mode == "in-cluster":
            for comp, (app, needle) in IN_CLUSTER.items():
                for pod in component_pods(cluster, app):
                    for pid in pids_of_pod(pod["metadata"]["uid"]):
                        if needle in cmdline(pid):
                            out.setdefault(comp, []).append(pid)
        # The load generator itself (this process, its client, watch and fleet
        # processes): on a real control plane it runs elsewhere, here it takes
        # its share of the same two cores.
        taken = {p for pids in out.values() for p in pids} | cluster_pids
        taken.update(descendants(*cluster_pids))
        out["bench-main"] = [os.getpid()]
        for pid in descendants(os.getpid()):
            if pid not in taken:
                out.setdefault(roles.get(pid, "bench-main"), []).append(pid)
        return out

    return resolve


def standby_reaper(cluster: LocalCluster, log_dir: Path) -> HostReaper:
    """A second host reaper in the deployed one's election (host mode has one)."""
    port = free_port()
    argv = reaper_proc.serve_argv(
        port,
        cluster.kubeconfig,
        extra=[f"--namespace={NAMESPACE}", "--identity=bench-standby-reaper"],
    )
    h = HostReaper("bench-standby-reaper", port, argv)
    h.start(log_dir / "standby-reaper.log")
    return h


def open_env(
    *,
    state_dir: Path | None,
    host_components: bool,
    pods: int,
    per_node: int,
    run_dir: Path | None,
) -> ScaleEnv:
    cluster, owned = open_cluster(state_dir, host_components)
    try:
        tag = uuid.uuid4().hex[:6]
        run_dir = run_dir or Path(tempfile.mkdtemp(prefix=f"scale-run-{tag}-"))
        run_dir.mkdir(parents=True, exist_ok=True)
        core = CoreV1Api(api_client(cluster.kubeconfig))
        namespace = f"scale-{tag}"
        core.create_namespace({"metadata": {"name": namespace, "labels": {LABEL_BENCH: "scale"}}})
        nodes = add_nodes(core, pods_per_node_nodes(pods, per_node), per_node, tag)
        if cluster.config.deploy_reaper:
            own = [] if cluster.config.sandman_mode == "in-cluster" else None
            reapers = Reapers(cluster, own=own)
            if own is None:
                reapers.own = [standby_reaper(cluster, run_dir)]
        else:
            reapers = Reapers.host_pair(cluster, namespace, run_dir, ("--extension-grace=0",))
        watch = WatchProcess(cluster.kubeconfig, namespace, run_dir / "watch.jsonl")
        watch.start()
        roles: dict[int, str] = {}
        procs = cluster.processes()
        sampler = Sampler(resolver(cluster, procs, reapers, roles))
        sampler.start()
        env = ScaleEnv(
            cluster=cluster,
            owned=owned,
            namespace=namespace,
            run_dir=run_dir,
            nodes=nodes,
            watch=watch,
            reapers=reapers,
            sampler=sampler,
            bench_out=open(run_dir / "bench.jsonl", "a"),  # noqa: SIM115 (closed by close())
            roles=roles,
            procs=procs,
            deployment=cluster.deployment,
            tls={
                "apiserver": load_credentials(cluster.kubeconfig),
                "insecure": insecure_context(),
                "client-cert": _client_cert_context(cluster.kubeconfig),
            },
        )
        env.name_processes("bench-watch", [watch.proc.pid])
        env.start_scraping()
        reapers.wait_leader()
        return env
    except BaseException:
        if owned:
            cluster.down(purge=True)
        raise


__all__ = ["CounterTracker", "ScaleEnv", "open_env", "pods_per_node_nodes"]
