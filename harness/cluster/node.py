"""The real node's lifecycle: registry, containerd, kubelet, its network; clean teardown.

Start order: registry (the pause image must be pullable before any pod) ->
bridge, its host settings and the pods' read-only registry -> cgroup root ->
containerd -> kubelet -> kube-proxy and kube-router -> CoreDNS (netaddons.py).
Stop order matters more: the kubelet goes first (else it recreates the pods
we remove), then kube-router and kube-proxy, then every pod sandbox is
stopped and removed through CRI (which runs CNI teardown, so netns, veths and
IPAM leases go with it), then containerd, then leftover shims, mounts,
cgroups, the proxies' iptables rules, the guard table and the bridge.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from kubernetes.client import CoreV1Api

from sandman.harness.cluster import claim, gvisor, hostsetup
from sandman.harness.cluster import realnode as rn
from sandman.harness.cluster.binaries import Binaries
from sandman.harness.cluster.components import Layout, apiserver_url, write_yaml
from sandman.harness.cluster.config import ClusterConfig
from sandman.harness.cluster.kwok_nodes import is_ready
from sandman.harness.cluster.netaddons import NodeNetwork
from sandman.harness.cluster.pki import write_kubeconfig
from sandman.harness.cluster.process import ComponentFailed, ManagedProcess, wait_until
from sandman.harness.images.build import ImageBuilder
from sandman.harness.images.registry import Registry
from sandman.harness.kube import api_client, raw
from sandman.harness.probes import http_ok

Progress = Callable[[str], None]


def _socket_accepts(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(1)
        s.connect(str(path))
    return True


class RealNode:
    """One kubelet + containerd node of a local cluster (one per machine)."""

    def __init__(
        self, config: ClusterConfig, layout: Layout, binaries: Binaries, progress: Progress
    ) -> None:
        self.config = config
        self.node = config.real_node
        self.layout = layout
        self.lay = rn.NodeLayout(layout.state_dir / "node")
        self.binaries = binaries
        self.progress = progress
        self.net = NodeNetwork(config, layout, self.lay, binaries, progress, self._proc)

    @property
    def registry(self) -> Registry:
        return Registry(self.node.registry)

    def _proc(
        self,
        name: str,
        argv: list[str],
        stop_timeout_s: float = 10.0,
        env: dict[str, str] | None = None,
    ) -> ManagedProcess:
        return ManagedProcess(
            name=name,
            argv=tuple(argv),
            run_dir=self.layout.run,
            log_dir=self.layout.logs,
            stop_timeout_s=stop_timeout_s,
            env=env,
        )

    def processes(self) -> list[ManagedProcess]:
        return [
            self._proc("registry", rn.registry_argv(self.lay)),
            self._proc(
                "containerd",
                rn.containerd_argv(self.lay),
                # gVisor's shim is found on containerd's PATH.
                env=gvisor.containerd_env(self.binaries.containerd_shim_runsc.parent),
            ),
            self._proc("kubelet", rn.kubelet_argv(self.binaries.kubelet, self.config, self.lay)),
            self.net.pod_registry(),
            *self.net.proxies(),
        ]

    def health_checks(self) -> dict[str, Callable[[], bool]]:
        return {
            "registry": lambda: http_ok(f"http://{self.node.registry}/v2/"),
            # The socket accepts before the CRI plugin has initialised (slow
            # with much state to load); a kubelet started then exits with
            # "server is not initialized yet". Ready = answers a CRI call.
            "containerd": lambda: (
                _socket_accepts(self.lay.containerd_socket) and self._cri_answers()
            ),
            "kubelet": lambda: http_ok(
                f"http://127.0.0.1:{self.node.kubelet_healthz_port}/healthz"
            ),
            **self.net.health_checks(),
        }

    # -- up -----------------------------------------------------------------
    def conflict(self) -> str | None:
        """Another cluster's real node on this machine, or None."""
        holder = claim.holder_if_live()
        if holder is not None and holder != str(self.layout.state_dir.resolve()):
            return f"the cluster at {holder} holds it"
        procs = {p.name: p for p in self.processes()}
        if procs["kubelet"].running_pid() is not None:
            return None  # it is ours
        if hostsetup.bridge_exists(self.node.bridge):
            others = hostsetup.pids_with_arg("--hostname-override=" + self.node.name)
            if others:
                return f"bridge {self.node.bridge} and a kubelet (pid {others[0]}) already run"
        with socket.socket() as s:
            taken = s.connect_ex(("127.0.0.1", self.node.registry_port)) == 0
        if taken and procs["registry"].running_pid() is None:
            return f"port {self.node.registry_port} is taken by another process"
        return None

    def preflight(self) -> None:
        """Fail early (before the control plane binds the bridge address) if this
        machine cannot run the node or another cluster's node runs."""
        why = hostsetup.real_node_unsupported_reason()
        if why:
            raise hostsetup.HostSetupError(f"real node unsupported here: {why}")
        clash = self.conflict() or claim.take(self.layout.state_dir)
        if clash:
            raise hostsetup.HostSetupError(
                f"a real node is already running on this machine ({clash}); "
                "one real node per machine: stop the other cluster first"
            )
        # From here on the host parts are ours to make and to tear down.
        self.lay.root.mkdir(parents=True, exist_ok=True)
        self._host_marker.touch()
        hostsetup.ensure_packages(self.progress)

    @property
    def _host_marker(self) -> Path:
        return self.lay.root / "host-owned"

    def owns_host(self) -> bool:
        """Whether this cluster may tear down the host-global parts (bridge,
        iptables, guard, cgroup root): it holds the claim and got past its
        preflight, or nobody holds one and no other kubelet runs (a cluster
        started before claims existed)."""
        if claim.held_by(self.layout.state_dir):
            return self._host_marker.exists()
        if claim.holder_if_live() is not None:
            return False
        mine = next(p for p in self.processes() if p.name == "kubelet").running_pid()
        others = hostsetup.pids_with_arg("--hostname-override=" + self.node.name)
        return not [p for p in others if p != mine]

    def up(self, checks_out: dict[str, Callable[[], bool]] | None = None) -> None:
        self.preflight()
        self._write_files()
        checks = self.health_checks()
        procs = {p.name: p for p in self.processes()}
        self._start_and_wait(procs["registry"], checks)
        self._push_pause()
        self.ensure_bridge()
        self.net.prepare_host()
        self._start_and_wait(procs["registry-pods"], checks)
        hostsetup.ensure_cgroup_root(self.node.cgroup_root)
        self._start_and_wait(procs["containerd"], checks)
        self._start_and_wait(procs["kubelet"], checks)
        self._wait_node_ready(procs["kubelet"])
        gvisor.ensure_runtime_class(api_client(self.layout.admin_kubeconfig))
        self.progress(f"  RuntimeClass {gvisor.RUNTIME_CLASS} (handler {gvisor.HANDLER})")
        # The proxies read their Node at start: after the kubelet registered it.
        self.net.apply_rbac()
        for name in ("kube-proxy", "kube-router"):
            self._start_and_wait(procs[name], checks)
        coredns = ImageBuilder(self.config.cache_dir, self.progress).build_and_push(
            "coredns", self.registry
        )
        self.net.deploy_dns(coredns.ref)
        t = time.monotonic()
        self.net.wait_dns()
        self.progress(f"  coredns                  ready ({time.monotonic() - t:.1f}s)")

    def ensure_bridge(self) -> None:
        """The pod bridge with the host's address (also the apiserver's, so it
        is made before the control plane starts)."""
        net = ipaddress.ip_network(self.node.pod_cidr)
        hostsetup.ensure_bridge(self.node.bridge, self.node.node_ip, net.prefixlen)

    def _start_and_wait(self, proc: ManagedProcess, checks: dict[str, Callable[[], bool]]) -> None:
        t = time.monotonic()
        proc.start()
        wait_until(proc, checks[proc.name], timeout_s=self.config.start_timeout_s, what="healthy")
        self.progress(
            f"  {proc.name:<24} healthy ({time.monotonic() - t:.1f}s) log: {proc.log_file}"
        )

    def _write_files(self) -> None:
        lay, node = self.lay, self.node
        pki = self.layout.pki
        now = dt.datetime.now(dt.UTC)
        pki.ensure_cert(
            "kubelet-client",
            f"system:node:{node.name}",
            now=now,
            orgs=("system:nodes",),
            client=True,
        )
        pki.ensure_cert(
            "kubelet-serving",
            f"system:node:{node.name}",
            now=now,
            dns=(node.name, "localhost"),
            ips=(node.node_ip, "127.0.0.1"),
            server=True,
        )
        write_kubeconfig(
            lay.kubelet_kubeconfig,
            server=apiserver_url(self.config),
            pki=pki,
            cert="kubelet-client",
            user=f"system:node:{node.name}",
        )
        for d in (
            lay.containerd_dir,
            lay.cni_conf_dir,
            lay.cni_ipam_dir,
            lay.kubelet_dir,
            lay.registry_storage,
        ):
            d.mkdir(parents=True, exist_ok=True)
        lay.containerd_config.write_text(rn.containerd_config(node, lay))
        lay.runsc_config.write_text(gvisor.runsc_toml(self.binaries.runsc, lay.runsc_root))
        hosts = lay.registry_hosts_dir / node.registry / "hosts.toml"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(rn.registry_hosts_toml(node))
        (lay.cni_conf_dir / "10-sandman.conflist").write_text(
            rn.to_json(rn.cni_conflist(node, lay))
        )
        write_yaml(lay.kubelet_config, rn.kubelet_config(self.config, lay, pki.dir))
        write_yaml(lay.registry_config, rn.registry_config(node, lay))
        self.net.write_files(apiserver_url(self.config), now)

    def _push_pause(self) -> None:
        builder = ImageBuilder(self.config.cache_dir, self.progress)
        builder.build_and_push(rn.PAUSE_IMAGE, self.registry)

    def _wait_node_ready(self, kubelet: ManagedProcess) -> None:
        api = CoreV1Api(api_client(self.layout.admin_kubeconfig))

        def ready() -> bool:
            node = raw(api.read_node(self.node.name, _preload_content=False))
            return is_ready(node)

        wait_until(kubelet, ready, timeout_s=self.config.start_timeout_s, what="node Ready")
        self.progress(f"  node {self.node.name} Ready (InternalIP {self.node.node_ip})")

    # -- down ---------------------------------------------------------------
    def down(self) -> list[str]:
        procs = {p.name: p for p in self.processes()}
        stopped = []
        if procs["kubelet"].stop():
            stopped.append("kubelet")
        stopped += [n for n in ("kube-router", "kube-proxy") if procs[n].stop()]
        if procs["containerd"].running_pid() is not None:
            self._remove_all_pods()
        if procs["containerd"].stop():
            stopped.append("containerd")
        # Shims outlive containerd by design; ours carry our socket path.
        hostsetup.kill_processes_with_arg(str(self.lay.containerd_socket))
        for what in gvisor.teardown(self.lay.runsc_root):
            self.progress(f"  gvisor: {what}")
        if self.lay.root.exists():
            hostsetup.unmount_under(self.lay.root)
        if self.owns_host():
            left = hostsetup.remove_cgroup_root(self.node.cgroup_root)
            if left:
                self.progress(f"warning: cgroups still busy: {', '.join(left[:3])}")
            for problem in self.net.teardown():
                self.progress(f"warning: {problem}")
            if hostsetup.bridge_exists(self.node.bridge):
                hostsetup.delete_bridge(self.node.bridge)
        else:
            self.progress("  the real node's host parts belong to another cluster: left alone")
        for d in (Path("/run/containerd/s"), Path("/run/containerd")):
            with contextlib.suppress(OSError):
                d.rmdir()  # only if empty: another containerd may use it
        stopped += [n for n in ("registry-pods", "registry") if procs[n].stop()]
        claim.release(self.layout.state_dir)
        return stopped

    def _remove_all_pods(self) -> None:
        argv = rn.crictl_argv(self.binaries.crictl, self.lay, "rmp", "--force", "--all")
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            self.progress(f"warning: crictl rmp failed: {proc.stderr.strip()[-500:]}")

    def _cri_answers(self) -> bool:
        argv = rn.crictl_argv(self.binaries.crictl, self.lay, "version")
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0

    def crictl(self, *args: str) -> str:
        argv = rn.crictl_argv(self.binaries.crictl, self.lay, *args)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise ComponentFailed(self.processes()[1], f"crictl {' '.join(args)}: {proc.stderr}")
        return proc.stdout
