"""Command lines and config files of the control-plane components.

Pure: given the cluster config and its file layout, return argv and file
contents. ``local.py`` does the starting, waiting and stopping.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml

from sandman.harness.cluster.binaries import Binaries
from sandman.harness.cluster.config import KWOK_POD_CIDR, SERVICE_CIDR, ClusterConfig, ExtenderSpec
from sandman.harness.cluster.pki import Pki

SANDMAN_SCHEDULER = "sandman-scheduler"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"

# Client rate limits of the controllers. client-go's defaults (20 qps, burst 30)
# make the ReplicaSet controller and the scheduler the bottleneck long before
# the apiserver when a batch asks for thousands of pods; these are the values
# kwok's own scale tests use for a single control plane.
CONTROLLER_QPS = 300
CONTROLLER_BURST = 600


def service_ip(cidr: str = SERVICE_CIDR) -> str:
    """The `kubernetes` Service's ClusterIP: the first address of the range."""
    return str(next(ipaddress.ip_network(cidr).hosts()))


# kube-dns' ClusterIP: the tenth address of the range, as kubeadm and kind
# choose it; the kubelet's clusterDNS.
CLUSTER_DNS_IP = str(ipaddress.ip_network(SERVICE_CIDR).network_address + 10)
CLUSTER_DOMAIN = "cluster.local"


def apiserver_address(cfg: ClusterConfig) -> str:
    """Where the apiserver listens and what it advertises.

    With the real node: the host's address on the pod bridge, so that pods
    reach it (the `kubernetes` Service gets that endpoint; kube-proxy carries
    10.96.0.1:443 there) and nothing but the host and its pods can. Without:
    loopback. Never every interface.
    """
    return cfg.real_node.node_ip if cfg.real_node.enabled else "127.0.0.1"


def apiserver_url(cfg: ClusterConfig) -> str:
    return f"https://{apiserver_address(cfg)}:{cfg.ports.apiserver}"


@dataclass(frozen=True)
class Layout:
    """Where a cluster keeps its files, all under the state dir."""

    state_dir: Path

    @property
    def pki(self) -> Pki:
        return Pki(self.state_dir / "pki")

    @property
    def etcd_data(self) -> Path:
        return self.state_dir / "etcd"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    @property
    def run(self) -> Path:
        return self.state_dir / "run"

    @property
    def config_dir(self) -> Path:
        return self.state_dir / "config"

    def kubeconfig(self, who: str) -> Path:
        return self.state_dir / f"{who}.kubeconfig"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfig("admin")

    @property
    def admission_config(self) -> Path:
        """The apiserver's AdmissionConfiguration (harness/cluster/admission.py)."""
        return self.config_dir / "admission.yaml"

    @property
    def admission_kubeconfig(self) -> Path:
        return self.config_dir / "admission-webhooks.kubeconfig"


def etcd_argv(cfg: ClusterConfig, bins: Binaries, lay: Layout) -> list[str]:
    client = f"http://127.0.0.1:{cfg.ports.etcd_client}"
    peer = f"http://127.0.0.1:{cfg.ports.etcd_peer}"
    return [
        str(bins.etcd),
        "--name=sandman",
        f"--data-dir={lay.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=sandman={peer}",
        "--initial-cluster-state=new",
        # A disposable test cluster: skipping fsync multiplies etcd's write rate
        # on these VMs' disks, and losing it on a host crash only costs a re-up.
        "--unsafe-no-fsync=true",
        # 8 GiB: room for 12k+ pods plus their events between compactions.
        "--quota-backend-bytes=8589934592",
        "--log-level=warn",
    ]


def apiserver_argv(cfg: ClusterConfig, bins: Binaries, lay: Layout) -> list[str]:
    pki = lay.pki
    return [
        str(bins.kube_apiserver),
        f"--bind-address={apiserver_address(cfg)}",
        f"--advertise-address={apiserver_address(cfg)}",
        f"--secure-port={cfg.ports.apiserver}",
        f"--etcd-servers=http://127.0.0.1:{cfg.ports.etcd_client}",
        f"--cert-dir={lay.state_dir / 'apiserver-certs'}",
        f"--client-ca-file={pki.ca}",
        f"--tls-cert-file={pki.crt('apiserver')}",
        f"--tls-private-key-file={pki.key('apiserver')}",
        f"--kubelet-client-certificate={pki.crt('apiserver-kubelet-client')}",
        f"--kubelet-client-key={pki.key('apiserver-kubelet-client')}",
        f"--kubelet-certificate-authority={pki.ca}",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        # Front-proxy (aggregation) settings; without them every component
        # that delegates authn logs a missing requestheader CA forever.
        f"--requestheader-client-ca-file={pki.crt('front-proxy-ca')}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.crt('front-proxy-client')}",
        f"--proxy-client-key-file={pki.key('front-proxy-client')}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        # Its client certificate for admission webhooks (harness/cluster/admission.py).
        f"--admission-control-config-file={lay.admission_config}",
        "--allow-privileged=true",
        # The endpoint reconciler publishes the advertise address as the
        # `kubernetes` Service's endpoint; a loopback one is rejected (and
        # useless to pods), so without the real node there is none.
        *(() if cfg.real_node.enabled else ("--endpoint-reconciler-type=none",)),
        # Bursts of thousands of pod creates are the workload; the defaults
        # (400/200) reject them with 429 before etcd is the limit.
        "--max-requests-inflight=1600",
        "--max-mutating-requests-inflight=800",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_argv(cfg: ClusterConfig, bins: Binaries, lay: Layout) -> list[str]:
    pki = lay.pki
    kc = lay.kubeconfig("controller-manager")
    return [
        str(bins.kube_controller_manager),
        "--bind-address=127.0.0.1",
        f"--secure-port={cfg.ports.controller_manager}",
        f"--cert-dir={lay.state_dir / 'controller-manager-certs'}",
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        # One instance: leader election would only add start-up latency (and a
        # wait for a stale lease after an unclean stop).
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca}",
        f"--cluster-signing-cert-file={pki.ca}",
        f"--cluster-signing-key-file={pki.key('ca')}",
        "--controllers=*",
        f"--kube-api-qps={CONTROLLER_QPS}",
        f"--kube-api-burst={CONTROLLER_BURST}",
        "--concurrent-replicaset-syncs=10",
        "--concurrent-deployment-syncs=10",
        "--concurrent-job-syncs=10",
        "--concurrent-gc-syncs=40",
        "--profiling=false",
        "--v=1",
    ]


def scheduler_config(
    name: str, kubeconfig: Path, extenders: tuple[ExtenderSpec, ...] = ()
) -> dict[str, object]:
    doc: dict[str, object] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {
            "kubeconfig": str(kubeconfig),
            "qps": CONTROLLER_QPS,
            "burst": CONTROLLER_BURST,
        },
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": name}],
    }
    if extenders:
        # Score every feasible node: by default large clusters score only a
        # sample, which may miss the one node that holds a multi-GB image.
        doc["percentageOfNodesToScore"] = 100
        doc["extenders"] = [
            {
                "urlPrefix": e.url_prefix,
                "filterVerb": e.filter_verb,
                "prioritizeVerb": e.prioritize_verb,
                "weight": e.weight,
                "nodeCacheCapable": e.node_cache_capable,
                "ignorable": e.ignorable,
                "httpTimeout": e.http_timeout,
                "enableHTTPS": e.url_prefix.startswith("https://"),
                # Host-side extenders serve a self-signed loopback certificate.
                **({"tlsConfig": {"insecure": True}} if e.url_prefix.startswith("https") else {}),
            }
            for e in extenders
        ]
    return doc


def scheduler_argv(
    bins: Binaries, lay: Layout, *, config_file: Path, port: int, name: str
) -> list[str]:
    kc = lay.kubeconfig("scheduler")
    return [
        str(bins.kube_scheduler),
        f"--config={config_file}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={lay.state_dir / (name + '-certs')}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--v=1",
    ]


def kwok_argv(cfg: ClusterConfig, bins: Binaries, lay: Layout) -> list[str]:
    return [
        str(bins.kwok),
        f"--kubeconfig={lay.kubeconfig('kwok')}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
        f"--cidr={KWOK_POD_CIDR}",
        f"--server-address=127.0.0.1:{cfg.ports.kwok}",
        # Node heartbeats through Leases instead of status updates: at hundreds
        # of nodes, status heartbeats are most of the apiserver's write load.
        "--node-lease-duration-seconds=40",
    ]


def write_yaml(path: Path, doc: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.replace(path)
    return path
