"""The local cluster: start, health-wait, inspect and stop its components.

``up`` is idempotent (running components are left alone, dead ones restarted);
``down`` stops exactly the processes whose pid files it wrote. Each component
logs to ``<state-dir>/logs/<name>.log``; a failure names the component and
shows the tail of that log.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import shutil
import ssl
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.harness.cluster import admission
from sandman.harness.cluster import components as comp
from sandman.harness.cluster.binaries import Binaries, ensure_binaries
from sandman.harness.cluster.config import ClusterConfig
from sandman.harness.cluster.deploy import LocalDeployment
from sandman.harness.cluster.incluster import InClusterDeployment
from sandman.harness.cluster.kwok_nodes import (
    KWOK_NODE_SELECTOR,
    is_ready,
    kwok_node,
    kwok_node_name,
)
from sandman.harness.cluster.node import RealNode
from sandman.harness.cluster.pki import write_kubeconfig
from sandman.harness.cluster.process import (
    ComponentFailed,
    ManagedProcess,
    wait_healthy,
    wait_until,
)
from sandman.harness.images.build import ImageBuilder, image_ref
from sandman.harness.kube import api_client, raw
from sandman.harness.probes import http_ok, insecure_context

Progress = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    healthy: bool
    log_file: Path


@dataclass(frozen=True)
class ClusterStatus:
    state_dir: Path
    kubeconfig: Path
    server: str
    components: list[ComponentStatus]
    nodes_ready: int
    nodes_total: int

    @property
    def running(self) -> bool:
        return bool(self.components) and all(c.pid is not None for c in self.components)


class LocalCluster:
    """A control plane of upstream binaries on loopback, plus kwok nodes.

    Not safe for concurrent use from several processes at once: ``up`` and
    ``down`` take an exclusive lock on the state dir for that reason.
    """

    def __init__(
        self,
        config: ClusterConfig,
        *,
        binaries: Binaries | None = None,
        progress: Progress = _stderr,
    ) -> None:
        self.config = config
        self.layout = comp.Layout(config.state_dir)
        self._binaries = binaries
        self._progress = progress
        self._daemon_image: str | None = None

    @classmethod
    def at(cls, state_dir: Path, progress: Progress = _stderr) -> LocalCluster:
        """The cluster whose config was saved in ``state_dir`` by ``up``."""
        cfg = ClusterConfig.load(state_dir)
        if cfg is None:
            raise FileNotFoundError(f"no cluster at {state_dir} (run `sandman cluster up`)")
        return cls(cfg, progress=progress)

    # -- paths -----------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.layout.admin_kubeconfig

    @property
    def server(self) -> str:
        return comp.apiserver_url(self.config)

    @property
    def binaries(self) -> Binaries:
        if self._binaries is None:
            self._binaries = Binaries.in_cache(self.config.cache_dir, self.config.versions)
        return self._binaries

    # -- components ------------------------------------------------------
    def _proc(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> ManagedProcess:
        return ManagedProcess(
            name=name, argv=tuple(argv), run_dir=self.layout.run, log_dir=self.layout.logs, env=env
        )

    def _schedulers(self) -> list[tuple[ManagedProcess, int]]:
        lay, bins, cfg = self.layout, self.binaries, self.config
        out = []
        specs: list[tuple[str, int, tuple[comp.ExtenderSpec, ...]]] = [
            ("default-scheduler", cfg.ports.scheduler, ())
        ]
        # Injected sandboxes ask for sandman-scheduler: it runs whenever Sandman is
        # deployed (with the extender once one is configured).
        # In-cluster, sandman-scheduler is a Deployment (manifests/extender).
        if cfg.sandman_scheduler or cfg.sandman_mode == "host":
            specs.append(
                (comp.SANDMAN_SCHEDULER, cfg.ports.sandman_scheduler, self.sandman_extenders())
            )
        for name, port, _extenders in specs:
            conf = lay.config_dir / f"{name}.yaml"
            proc_name = "kube-scheduler" if name == "default-scheduler" else name
            out.append(
                (
                    self._proc(
                        proc_name,
                        comp.scheduler_argv(bins, lay, config_file=conf, port=port, name=proc_name),
                    ),
                    port,
                )
            )
        return out

    def processes(self) -> list[ManagedProcess]:
        """Every component, in start order."""
        return [
            *self._control_plane(),
            *(self.real_node.processes() if self.real_node else []),
            *(self.deployment.processes() if self.deployment else []),
        ]

    @property
    def deployment(self) -> LocalDeployment | InClusterDeployment | None:
        """Sandman on this cluster: in-cluster (real node), host processes, or None."""
        mode = self.config.sandman_mode
        if mode == "in-cluster":
            return InClusterDeployment(self.config, self.layout, self._progress)
        if mode == "host":
            return LocalDeployment(self.config, self.layout, self.daemon_image(), self._progress)
        return None

    def daemon_image(self) -> str:
        """The daemon image reference the webhook injects (content-keyed tag).

        Computed once per instance: the key hashes the daemon's sources, and
        long-running callers (the scale bench's samplers) asked for it every
        few seconds through ``processes()``/``deployment`` (docs/scale.md).
        """
        if self._daemon_image is None:
            registry = self.config.real_node.registry
            self._daemon_image = image_ref("daemon", registry, self.config.cache_dir, version="dev")
        return self._daemon_image

    def _control_plane(self) -> list[ManagedProcess]:
        lay, bins, cfg = self.layout, self.binaries, self.config
        # kwok reads ~/.kwok/kwok.yaml when it exists; a private HOME keeps a
        # user's kwok config out of this cluster.
        kwok_env = dict(os.environ, HOME=str(lay.state_dir / "kwok-home"))
        return [
            self._proc("etcd", comp.etcd_argv(cfg, bins, lay)),
            self._proc("kube-apiserver", comp.apiserver_argv(cfg, bins, lay)),
            self._proc("kube-controller-manager", comp.controller_manager_argv(cfg, bins, lay)),
            *(p for p, _ in self._schedulers()),
            self._proc("kwok", comp.kwok_argv(cfg, bins, lay), env=kwok_env),
        ]

    def sandman_extenders(self) -> tuple[comp.ExtenderSpec, ...]:
        """sandman-scheduler's extenders: configured ones, else ours when deployed."""
        if self.config.extenders or self.config.sandman_mode != "host":
            return self.config.extenders
        from sandman.harness.cluster.extender import extender_spec

        return (extender_spec(self.config.ports.extender),)

    @property
    def real_node(self) -> RealNode | None:
        if not self.config.real_node.enabled:
            return None
        return RealNode(self.config, self.layout, self.binaries, self._progress)

    def _health_checks(self) -> dict[str, Callable[[], bool]]:
        ports = self.config.ports
        api_ctx = ssl.create_default_context(cafile=str(self.layout.pki.ca))
        # Controller-manager and scheduler serve health on self-signed loopback
        # certificates they generate at start; only reachability is checked.
        ins = insecure_context()
        checks: dict[str, Callable[[], bool]] = {
            "etcd": lambda: http_ok(f"http://127.0.0.1:{ports.etcd_client}/health"),
            "kube-apiserver": lambda: http_ok(f"{self.server}/readyz", context=api_ctx),
            "kube-controller-manager": lambda: http_ok(
                f"https://127.0.0.1:{ports.controller_manager}/healthz", context=ins
            ),
            "kwok": lambda: http_ok(f"http://127.0.0.1:{ports.kwok}/healthz"),
        }
        for proc, port in self._schedulers():
            checks[proc.name] = lambda port=port: http_ok(
                f"https://127.0.0.1:{port}/healthz", context=ins
            )
        if self.real_node:
            checks.update(self.real_node.health_checks())
        if self.config.sandman_mode == "host":
            deployment = LocalDeployment(self.config, self.layout, "", self._progress)
            checks.update(deployment.health_checks())
        return checks

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.config.state_dir / ".lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    # -- up --------------------------------------------------------------
    def up(self) -> None:
        t0 = time.monotonic()
        with self._locked():
            self._binaries = ensure_binaries(
                self.config.cache_dir,
                self.config.versions,
                self._progress,
                real_node=self.config.real_node.enabled,
            )
            self.config.save()
            if self.real_node:
                # The apiserver listens on the pod bridge's address: the node's
                # checks run, and the bridge is made, before it starts.
                self.real_node.preflight()
                self.real_node.ensure_bridge()
            self._write_files()
            checks = self._health_checks()
            procs = {p.name: p for p in self._control_plane()}
            # etcd, then the apiserver; the rest only need the apiserver and
            # start together, which is most of a warm `up`'s speed.
            for name in ("etcd", "kube-apiserver"):
                self._start_and_wait(procs.pop(name), checks)
            for p in procs.values():
                p.start()
            for p in procs.values():
                self._wait_healthy(p, checks)
            self._ensure_kwok_nodes()
            self._wait_default_service_account()
            if self.real_node:
                self.real_node.up()
            if self.config.deploy_sandman:
                self._deploy()
        nodes = f"{self.config.kwok_nodes} kwok nodes"
        if self.real_node:
            nodes += f" + real node {self.config.real_node.name}"
        self._progress(
            f"cluster up in {time.monotonic() - t0:.1f}s: {nodes}; "
            f"export KUBECONFIG={self.kubeconfig}"
        )

    def _deploy(self) -> None:
        if self.config.sandman_mode == "in-cluster":
            InClusterDeployment(self.config, self.layout, self._progress).up()
            return
        image = self.daemon_image()
        if self.real_node:
            builder = ImageBuilder(self.config.cache_dir, self._progress)
            # Pods on the real node pull it; kwok pods only carry the name.
            builder.build_and_push("daemon", self.real_node.registry, version="dev")
            # The webhook reads the ENTRYPOINT/CMD of sandboxes without a command
            # from the registry: tiny is what kwok pods and its registration
            # probe name, so it must be there before the webhook is.
            builder.build_and_push("tiny", self.real_node.registry)
        LocalDeployment(self.config, self.layout, image, self._progress).up()

    def _write_files(self) -> None:
        lay = self.layout
        now = dt.datetime.now(dt.UTC)
        extra = (self.config.real_node.node_ip,) if self.config.real_node.enabled else ()
        lay.pki.ensure_control_plane(now, comp.service_ip(), extra_ips=extra)
        for who, cert in (
            ("admin", "admin"),
            ("controller-manager", "controller-manager"),
            ("scheduler", "scheduler"),
            ("kwok", "kwok"),
        ):
            write_kubeconfig(
                lay.kubeconfig(who), server=self.server, pki=lay.pki, cert=cert, user=who
            )
        hosts = admission.webhook_hosts(self.config.ports.webhook)
        comp.write_yaml(lay.admission_kubeconfig, admission.kubeconfig(lay.pki, hosts))
        comp.write_yaml(lay.admission_config, admission.configuration(lay.admission_kubeconfig))
        for proc, _ in self._schedulers():
            name = "default-scheduler" if proc.name == "kube-scheduler" else proc.name
            extenders = self.sandman_extenders() if name == comp.SANDMAN_SCHEDULER else ()
            comp.write_yaml(
                lay.config_dir / f"{name}.yaml",
                comp.scheduler_config(name, lay.kubeconfig("scheduler"), extenders),
            )

    def _start_and_wait(self, proc: ManagedProcess, checks: dict[str, Callable[[], bool]]) -> None:
        proc.start()
        self._wait_healthy(proc, checks)

    def _wait_healthy(self, proc: ManagedProcess, checks: dict[str, Callable[[], bool]]) -> None:
        wait_healthy(
            proc, checks[proc.name], timeout_s=self.config.start_timeout_s, progress=self._progress
        )

    def core(self) -> CoreV1Api:
        return CoreV1Api(api_client(self.kubeconfig))

    def _ensure_kwok_nodes(self) -> None:
        api = self.core()
        want = {kwok_node_name(i) for i in range(self.config.kwok_nodes)}
        have = {
            n["metadata"]["name"]
            for n in raw(api.list_node(label_selector=KWOK_NODE_SELECTOR, _preload_content=False))[
                "items"
            ]
        }
        for name in sorted(want - have):
            api.create_node(kwok_node(name, self.config.kwok_node))
        for name in sorted(have - want):
            with contextlib.suppress(ApiException):
                api.delete_node(name)
        kwok = next(p for p in self.processes() if p.name == "kwok")

        def all_ready() -> bool:
            items = raw(api.list_node(label_selector=KWOK_NODE_SELECTOR, _preload_content=False))[
                "items"
            ]
            return sum(is_ready(n) for n in items) >= len(want)

        wait_until(
            kwok, all_ready, timeout_s=self.config.start_timeout_s, what="reporting nodes Ready"
        )
        self._progress(f"  {len(want)} kwok nodes Ready")

    def _wait_default_service_account(self) -> None:
        # Pod admission rejects pods until the namespace's `default`
        # ServiceAccount exists; callers right after `up` would race it.
        api = self.core()
        kcm = next(p for p in self.processes() if p.name == "kube-controller-manager")

        def exists() -> bool:
            api.read_namespaced_service_account("default", "default")
            return True

        wait_until(
            kcm, exists, timeout_s=self.config.start_timeout_s, what="creating ServiceAccounts"
        )

    # -- down / status -----------------------------------------------------
    def down(self, *, purge: bool = False) -> list[str]:
        """Stop every component (reverse start order); optionally delete state."""
        with self._locked():
            stopped: list[str] = []
            if self.config.sandman_mode == "host":
                stopped += LocalDeployment(self.config, self.layout, "", self._progress).down()
            stopped += self.real_node.down() if self.real_node else []
            stopped += [p.name for p in reversed(self._control_plane()) if p.stop()]
            stopped += self._stop_unlisted()
            if purge:
                for child in self.config.state_dir.iterdir():
                    if child.name == ".lock":
                        continue
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
        if purge:
            shutil.rmtree(self.config.state_dir, ignore_errors=True)
        return stopped

    def _stop_unlisted(self) -> list[str]:
        """Processes with a pid file in this cluster's run dir that the lists
        above do not name (started under another config, e.g. with the reaper
        deployed): they are this cluster's, and purging would orphan them."""
        run = self.layout.run
        if not run.is_dir():
            return []
        pid_files = sorted(run.glob("*.pid"))
        return [f.stem for f in pid_files if ManagedProcess(f.stem, (), run, run).stop()]

    def status(self) -> ClusterStatus:
        checks = self._health_checks()
        comps = []
        for p in self.processes():
            pid = p.running_pid()
            healthy = False
            if pid is not None:
                with contextlib.suppress(Exception):
                    healthy = checks[p.name]()
            comps.append(ComponentStatus(p.name, pid, healthy, p.log_file))
        ready = total = 0
        if any(c.name == "kube-apiserver" and c.healthy for c in comps):
            with contextlib.suppress(Exception):
                items = raw(self.core().list_node(_preload_content=False, _request_timeout=5))[
                    "items"
                ]
                total = len(items)
                ready = sum(is_ready(n) for n in items)
        return ClusterStatus(
            self.config.state_dir, self.kubeconfig, self.server, comps, ready, total
        )


__all__ = ["ClusterStatus", "ComponentFailed", "LocalCluster"]
