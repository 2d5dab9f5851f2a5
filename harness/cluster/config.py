"""Configuration of the local cluster, as explicit dataclasses.

A cluster's config is written to ``<state-dir>/cluster.json`` by ``up`` so that
``status``/``down`` (separate CLI invocations) and the test harness address the
same ports and files without re-deriving them from flags.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

# Pinned upstream versions. Kubernetes 1.34 is the newest line whose kubelet still
# defaults to failCgroupV1=false (1.35 flipped it), and these hosts are cgroup v1;
# etcd 3.5, the line Kubernetes shipped with through 1.33 (1.34's own build pins
# 3.6), runs under 1.34 (every tier here uses it) and a disposable cluster gains
# nothing from 3.6; kwok 0.7 is the newest served release that
# builds against Go 1.24 without a toolchain switch.
KUBERNETES_VERSION = "v1.34.4"
ETCD_VERSION = "v3.5.35"
KWOK_VERSION = "v0.7.0"
# crictl of the same minor as Kubernetes: the real node's teardown uses it.
CRITOOLS_VERSION = "v1.34.0"
# gVisor (runsc + our containerd shim main, hack/gvisor): the module proxy
# serves only pseudo-versions of its go branch (`go list -m gvisor.dev/gvisor@latest`
# on 2026-12-01); this one runs here on the systrap platform (docs/local-cluster.md).
GVISOR_VERSION = "v0.0.0-20260905035102-160fafc42237"
# The real node's cluster DNS (kube-system/coredns): the newest release on the
# proxy (2026-10-21); its go.mod asks for Go 1.26 (v1.14.7 would do with 1.25).
COREDNS_VERSION = "v1.15.0"
# The real node's NetworkPolicy enforcer (firewall controller only): the only
# v2 release this machine's module proxy serves (later tags answer 403).
KUBE_ROUTER_VERSION = "v2.1.0"

# Kubernetes' own service range default; it and KWOK_POD_CIDR stay inside 10/8 so
# nothing overlaps the host's 192.0.2.0/24. KWOK pod IPs are never routed: they
# only need to be unique, and a /12 holds a million pods (the scale target is 12k).
SERVICE_CIDR = "10.96.0.0/16"
KWOK_POD_CIDR = "10.160.0.0/12"


def default_state_dir() -> Path:
    env = os.environ.get("SANDMAN_STATE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sandman" / "cluster"


def default_cache_dir() -> Path:
    env = os.environ.get("SANDMAN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "sandman"


@dataclass(frozen=True)
class Versions:
    kubernetes: str = KUBERNETES_VERSION
    etcd: str = ETCD_VERSION
    kwok: str = KWOK_VERSION
    critools: str = CRITOOLS_VERSION
    gvisor: str = GVISOR_VERSION
    coredns: str = COREDNS_VERSION
    kube_router: str = KUBE_ROUTER_VERSION


@dataclass(frozen=True)
class Ports:
    """Loopback ports of the control plane.

    The defaults avoid the well-known ports (2379, 10250, ...) so that a cluster
    started by the test harness can run next to a developer's ``make up`` one;
    ``Ports.free()`` picks unused ones for exactly that.
    """

    etcd_client: int = 23790
    etcd_peer: int = 23800
    apiserver: int = 16443
    controller_manager: int = 20257
    scheduler: int = 20259
    sandman_scheduler: int = 20261
    kwok: int = 20247
    webhook: int = 20443
    reaper: int = 20080
    extender: int = 20890

    @classmethod
    def free(cls) -> Ports:
        names = [f.name for f in dataclasses.fields(cls)]
        socks = []
        try:
            for _ in names:
                s = socket.socket()
                s.bind(("127.0.0.1", 0))
                socks.append(s)
            return cls(**{n: s.getsockname()[1] for n, s in zip(names, socks, strict=True)})
        finally:
            for s in socks:
                s.close()

    def items(self) -> list[tuple[str, int]]:
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]


@dataclass(frozen=True)
class KwokNodeShape:
    """Capacity each simulated node advertises.

    110 pods is the kubelet default; the scale benchmarks raise it rather than
    adding thousands of nodes, because node objects cost watch traffic too.
    """

    cpu: str = "32"
    memory: str = "256Gi"
    pods: int = 110
    ephemeral_storage: str = "1Ti"


@dataclass(frozen=True)
class ExtenderSpec:
    """A scheduler extender the second scheduler calls (host-side URL)."""

    url_prefix: str
    weight: int = 10
    http_timeout: str = "100ms"
    node_cache_capable: bool = True
    ignorable: bool = True
    filter_verb: str = ""
    prioritize_verb: str = "prioritize"


@dataclass(frozen=True)
class RealNodeConfig:
    """The one real node (kubelet + containerd) a cluster may have.

    Host-global resources (the bridge, ports 5000/10250, the cgroup root) make
    it one real node per machine; see ``sandman.harness.cluster.realnode``.
    """

    enabled: bool = False
    name: str = "sandman-node"
    bridge: str = "sandman0"
    # Pod network of the real node; 10.244/16 is the customary pod range and
    # stays clear of the host's 192.0.2.0/24, the service and kwok ranges.
    pod_cidr: str = "10.244.0.0/24"
    registry_port: int = 5000
    kubelet_port: int = 10250
    kubelet_healthz_port: int = 10248
    cgroup_root: str = "/sandman"
    max_pods: int = 110
    # Host-global loopback ports of the node's network add-ons (one real node
    # per machine, like the kubelet's): kube-proxy's upstream defaults, and a
    # free one for kube-router (its health server would bind every interface,
    # so it is off and its metrics serve as the health check).
    kube_proxy_healthz_port: int = 10256
    kube_proxy_metrics_port: int = 10249
    kube_router_metrics_port: int = 20245

    @property
    def node_ip(self) -> str:
        """The host's address on the pod bridge, also the node's InternalIP."""
        return str(next(ipaddress.ip_network(self.pod_cidr).hosts()))

    @property
    def registry(self) -> str:
        return f"127.0.0.1:{self.registry_port}"

    @property
    def pod_registry(self) -> str:
        """The registry as pods reach it: a read-only instance on the bridge address."""
        return f"{self.node_ip}:{self.registry_port}"


@dataclass(frozen=True)
class ClusterConfig:
    state_dir: Path = field(default_factory=default_state_dir)
    cache_dir: Path = field(default_factory=default_cache_dir)
    kwok_nodes: int = 3
    kwok_node: KwokNodeShape = field(default_factory=KwokNodeShape)
    ports: Ports = field(default_factory=Ports)
    versions: Versions = field(default_factory=Versions)
    # The second scheduler (`sandman-scheduler`, the one sandboxes are assigned
    # to) runs when asked for and whenever Sandman is deployed; ``extenders``
    # are the extenders it calls (harness/cluster/extender.py).
    sandman_scheduler: bool = False
    extenders: tuple[ExtenderSpec, ...] = ()
    real_node: RealNodeConfig = field(default_factory=RealNodeConfig)
    # Run Sandman's own components (webhook, reaper, extender, sandman-scheduler):
    # in-cluster on the real node (the default), or as host processes when
    # `host_components` is set or there is no real node.
    deploy_sandman: bool = False
    host_components: bool = False
    # ... including the reaper. The test harness leaves it out: tests run their
    # own reapers, scoped to their namespaces, with their own settings.
    deploy_reaper: bool = True
    # Seconds each component gets to become healthy before `up` fails.
    start_timeout_s: float = 60.0

    @property
    def sandman_mode(self) -> str | None:
        """How Sandman runs here: "in-cluster", "host" or None (not deployed)."""
        if not self.deploy_sandman:
            return None
        if self.real_node.enabled and not self.host_components:
            return "in-cluster"
        return "host"

    @property
    def config_file(self) -> Path:
        return self.state_dir / "cluster.json"

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["state_dir"] = str(self.state_dir)
        d["cache_dir"] = str(self.cache_dir)
        return json.dumps(d, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ClusterConfig:
        d = json.loads(text)
        return cls(
            state_dir=Path(d["state_dir"]),
            cache_dir=Path(d["cache_dir"]),
            kwok_nodes=int(d["kwok_nodes"]),
            kwok_node=KwokNodeShape(**d["kwok_node"]),
            ports=Ports(**{**dataclasses.asdict(Ports()), **d["ports"]}),
            versions=Versions(**d["versions"]),
            sandman_scheduler=bool(d.get("sandman_scheduler", False)),
            extenders=tuple(ExtenderSpec(**e) for e in d.get("extenders", [])),
            real_node=RealNodeConfig(**d.get("real_node", {})),
            deploy_sandman=bool(d.get("deploy_sandman", False)),
            host_components=bool(d.get("host_components", False)),
            deploy_reaper=bool(d.get("deploy_reaper", True)),
            start_timeout_s=float(d.get("start_timeout_s", 60.0)),
        )

    @classmethod
    def load(cls, state_dir: Path) -> ClusterConfig | None:
        path = state_dir / "cluster.json"
        if not path.exists():
            return None
        return cls.from_json(path.read_text())

    def save(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.config_file.with_suffix(".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(self.config_file)
