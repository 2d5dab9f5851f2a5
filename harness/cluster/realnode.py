"""The real node's configuration files and command lines (pure).

Settings found to work on these hosts (Debian 12, cgroup v1 controllers with
an empty cgroup2 mount at /sys/fs/cgroup/unified, containerd 1.6.20, runc
1.1.5, a root that lacks CAP_SYS_RESOURCE):

- kubelet ``cgroupDriver: cgroupfs`` (no systemd here) and
  ``failCgroupV1: false`` (1.34's default, spelled out for 1.35+).
- containerd ``restrict_oom_score_adj = true``: CRI gives the pause container
  oom_score_adj -998 and Guaranteed pods -997; without CAP_SYS_RESOURCE runc
  cannot lower it and fails with "can't get final child's PID from pipe: EOF"
  (the real cause shows only in runc's debug log). Restricting clamps the
  value to containerd's own (0).
- A second runtime, ``runsc`` (gVisor), for RuntimeClass ``gvisor``: see
  ``sandman.harness.cluster.gvisor``.
- ``failSwapOn: false``: no swap here, but CI machines may have some.
- The node's InternalIP is the host's address on our pod bridge: the kubelet
  refuses a loopback node IP, and the bridge never leaves the machine.
- The CNI bridge runs with ``isGateway: false`` and no routes: the host
  assigns the gateway address itself, so the plugin never turns on
  ip_forward, and pods have no default route: no traffic leaves the machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandman.harness.cluster import gvisor
from sandman.harness.cluster.components import CLUSTER_DNS_IP, CLUSTER_DOMAIN
from sandman.harness.cluster.config import SERVICE_CIDR, ClusterConfig, RealNodeConfig
from sandman.harness.cluster.kwok_nodes import NODE_KIND_LABEL

CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
RUNC = Path("/usr/sbin/runc")
PAUSE_IMAGE = "pause"  # recipe name in sandman.harness.images


@dataclass(frozen=True)
class NodeLayout:
    """Files of the real node, under ``<state-dir>/node``."""

    root: Path

    @property
    def containerd_dir(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_config(self) -> Path:
        return self.containerd_dir / "config.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_dir / "containerd.sock"

    @property
    def runc_root(self) -> Path:
        return self.containerd_dir / "runc"

    @property
    def runsc_root(self) -> Path:
        return self.containerd_dir / "runsc"

    @property
    def runsc_config(self) -> Path:
        return self.containerd_dir / "runsc.toml"

    @property
    def registry_hosts_dir(self) -> Path:
        return self.root / "certs.d"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"

    @property
    def registry_config(self) -> Path:
        return self.root / "registry.yml"

    @property
    def pod_registry_config(self) -> Path:
        return self.root / "registry-pods.yml"

    @property
    def kube_proxy_config(self) -> Path:
        return self.root / "kube-proxy.yaml"

    @property
    def kube_proxy_kubeconfig(self) -> Path:
        return self.root / "kube-proxy.kubeconfig"

    @property
    def kube_router_kubeconfig(self) -> Path:
        return self.root / "kube-router.kubeconfig"

    @property
    def registry_storage(self) -> Path:
        return self.root / "registry"


def containerd_config(node: RealNodeConfig, lay: NodeLayout) -> str:
    pause = f"{node.registry}/sandman/{PAUSE_IMAGE}:3.10"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{lay.containerd_dir / "root"}"
state = "{lay.containerd_dir / "state"}"
# Snapshotters that cannot work here only add start-up errors to the log.
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.devmapper",
]

[grpc]
  address = "{lay.containerd_socket}"

[ttrpc]
  address = "{lay.containerd_socket}.ttrpc"

[{cri}]
  # The pod infra image comes from our registry: nothing is pulled from the internet.
  sandbox_image = "{pause}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  restrict_oom_score_adj = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{RUNC}"
        Root = "{lay.runc_root}"
{gvisor.containerd_runtime(cri, lay.runsc_config)}  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{lay.cni_conf_dir}"
    max_conf_num = 1
  [{cri}.registry]
    config_path = "{lay.registry_hosts_dir}"
"""


def registry_hosts_toml(node: RealNodeConfig) -> str:
    """containerd's per-registry config: our registry speaks plain HTTP."""
    return f"""server = "http://{node.registry}"

[host."http://{node.registry}"]
  capabilities = ["pull", "resolve"]
"""


def cni_conflist(node: RealNodeConfig, lay: NodeLayout) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "sandman",
        "plugins": [
            {
                "type": "bridge",
                "bridge": node.bridge,
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.pod_cidr}]],
                    # ClusterIPs via the host, where kube-proxy translates
                    # them; still no default route (nothing else leaves).
                    "routes": [{"dst": SERVICE_CIDR, "gw": node.node_ip}],
                    "dataDir": str(lay.cni_ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(cfg: ClusterConfig, lay: NodeLayout, pki_dir: Path) -> dict[str, Any]:
    node = cfg.real_node
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.node_ip,
        "port": node.kubelet_port,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": node.kubelet_healthz_port,
        "readOnlyPort": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki_dir / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(pki_dir / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki_dir / "kubelet-serving.key"),
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{lay.containerd_socket}",
        # Report every image: the scheduler extender reads node.status.images,
        # and the default cap of 50 hides most of a task-image-heavy node.
        "nodeStatusMaxImages": -1,
        # Parallel pulls: a batch of sandboxes asks for many images at once.
        "serializeImagePulls": False,
        "maxPods": node.max_pods,
        # Shared build machines run with little free disk; evicting sandboxes
        # for it would turn a disk warning into failed tests.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 99,
        "imageGCLowThresholdPercent": 98,
        "volumePluginDir": str(lay.kubelet_dir / "volume-plugins"),
        "resolvConf": "/etc/resolv.conf",
        # kube-system/kube-dns (CoreDNS, deployed by the harness at up).
        "clusterDNS": [CLUSTER_DNS_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "containerLogMaxSize": "10Mi",
    }


def kubelet_argv(kubelet: Path, cfg: ClusterConfig, lay: NodeLayout) -> list[str]:
    node = cfg.real_node
    return [
        str(kubelet),
        f"--config={lay.kubelet_config}",
        f"--kubeconfig={lay.kubelet_kubeconfig}",
        f"--root-dir={lay.kubelet_dir}",
        f"--cert-dir={lay.kubelet_dir / 'pki'}",
        f"--hostname-override={node.name}",
        f"--node-ip={node.node_ip}",
        f"--node-labels={NODE_KIND_LABEL}=real",
        "--v=1",
    ]


def containerd_argv(lay: NodeLayout) -> list[str]:
    return ["containerd", f"--config={lay.containerd_config}"]


def registry_config(node: RealNodeConfig, lay: NodeLayout) -> dict[str, Any]:
    # Debian's packaged config listens on every interface: ours binds loopback.
    return {
        "version": 0.1,
        "log": {"level": "warn", "formatter": "text"},
        "storage": {
            "filesystem": {"rootdirectory": str(lay.registry_storage)},
            "delete": {"enabled": True},
        },
        "http": {"addr": node.registry, "headers": {"X-Content-Type-Options": ["nosniff"]}},
    }


def registry_argv(lay: NodeLayout, config: Path | None = None) -> list[str]:
    return ["docker-registry", "serve", str(config or lay.registry_config)]


def pod_registry_config(node: RealNodeConfig, lay: NodeLayout) -> dict[str, Any]:
    """A second registry process for pods, read-only, on the bridge address.

    Pods cannot reach the host's loopback, and docker-registry listens on one
    address; this instance serves the same storage (distribution's read-only
    maintenance mode refuses every write), so the webhook's image lookups
    and anything in a pod read exactly what was pushed to 127.0.0.1:5000.
    """
    doc = registry_config(node, lay)
    doc["http"] = {**doc["http"], "addr": node.pod_registry}
    doc["storage"] = {
        "filesystem": doc["storage"]["filesystem"],
        "maintenance": {"readonly": {"enabled": True}, "uploadpurging": {"enabled": False}},
    }
    return doc


# -- kube-proxy and kube-router (host processes, like the kubelet) -------------
def kube_proxy_config(cfg: ClusterConfig, lay: NodeLayout) -> dict[str, Any]:
    """iptables mode (kube-router's rules live in the same tables), loopback
    listeners only, and no host-wide sysctl touched (see each setting)."""
    node = cfg.real_node
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(lay.kube_proxy_kubeconfig)},
        "hostnameOverride": node.name,
        # Not a listen address: kube-proxy's idea of its node's primary IP.
        "bindAddress": node.node_ip,
        "healthzBindAddress": f"127.0.0.1:{node.kube_proxy_healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{node.kube_proxy_metrics_port}",
        "enableProfiling": False,
        "mode": "iptables",
        "clusterCIDR": node.pod_cidr,
        "detectLocalMode": "ClusterCIDR",
        # NodePorts on the node IP only: never on loopback (which would set
        # route_localnet=1 host-wide) nor on eth0.
        "nodePortAddresses": [f"{node.node_ip}/32"],
        "iptables": {
            "localhostNodePorts": False,
            "masqueradeAll": False,
            # 0x4000 as upstream; kube-router marks with 0x10000/0x20000.
            "masqueradeBit": 14,
            "minSyncPeriod": "1s",
            "syncPeriod": "30s",
        },
        # Zeros leave the host's conntrack sysctls alone: the defaults would
        # lower nf_conntrack_max (262144 -> 131072 on 2 cores) and rewrite
        # the TCP timeouts, machine-wide.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
            "tcpBeLiberal": False,
            "udpTimeout": "0s",
            "udpStreamTimeout": "0s",
        },
        # The default -999 needs CAP_SYS_RESOURCE, which this root lacks.
        "oomScoreAdj": 0,
        "configSyncPeriod": "15m0s",
        "logging": {"verbosity": 1},
    }


def kube_proxy_argv(kube_proxy: Path, lay: NodeLayout) -> list[str]:
    return [str(kube_proxy), f"--config={lay.kube_proxy_config}"]


def kube_router_argv(kube_router: Path, cfg: ClusterConfig, lay: NodeLayout) -> list[str]:
    """kube-router's network-policy controller only (no routing, proxy or BGP)."""
    node = cfg.real_node
    return [
        str(kube_router),
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--run-loadbalancer=false",
        f"--kubeconfig={lay.kube_router_kubeconfig}",
        f"--hostname-override={node.name}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--enable-ipv4=true",
        "--enable-ipv6=false",
        # Its health server binds every interface and has no address flag.
        "--health-port=0",
        "--metrics-addr=127.0.0.1",
        f"--metrics-port={node.kube_router_metrics_port}",
        # Pod and policy events trigger syncs; the periodic one only repairs.
        "--iptables-sync-period=5m",
        "--v=1",
    ]


def crictl_argv(crictl: Path, lay: NodeLayout, *args: str) -> list[str]:
    return [
        str(crictl),
        f"--runtime-endpoint=unix://{lay.containerd_socket}",
        f"--image-endpoint=unix://{lay.containerd_socket}",
        "--timeout=30s",
        *args,
    ]


def to_json(doc: Any) -> str:
    return json.dumps(doc, indent=2) + "\n"
