"""The real node's network: Services (kube-proxy), DNS (CoreDNS), NetworkPolicy (kube-router).

Real upstream parts, as a cluster runs them, so that in-cluster clients
(Sandman's own pods among them) see what they would anywhere:

- kube-proxy (v1.34.4, iptables mode) and kube-router's network-policy
  controller (v2.1.0) run on the host next to the kubelet, each with its own
  client certificate (``system:kube-proxy``, bound by the bootstrap policy;
  ``system:kube-router``, bound by ``addons/kube-router-rbac.yaml``).
- CoreDNS (v1.15.0) runs as ``kube-system/coredns`` behind ``kube-dns``
  (10.96.0.10, the kubelet's ``clusterDNS``), on the pod network.
- A read-only registry on the bridge address serves pods what was pushed
  to 127.0.0.1:5000 (the webhook's ENTRYPOINT/CMD lookups).

Host changes, all undone by ``teardown``: bridge netfilter on, forwarding on
the bridge only, the Service range routed into the bridge, and an nftables
table that drops whatever a pod sends out of the bridge (pods have no
default route; this holds even for one that adds its own). kube-router and
kube-proxy leave their iptables rules when stopped; teardown removes them.
"""

from __future__ import annotations

import datetime as dt
import subprocess
from collections.abc import Callable
from pathlib import Path

from sandman.harness.cluster import hostsetup
from sandman.harness.cluster import realnode as rn
from sandman.harness.cluster.binaries import Binaries
from sandman.harness.cluster.components import CLUSTER_DNS_IP, Layout, write_yaml
from sandman.harness.cluster.config import SERVICE_CIDR, ClusterConfig
from sandman.harness.cluster.pki import write_kubeconfig
from sandman.harness.cluster.process import ManagedProcess
from sandman.harness.probes import http_ok

ADDONS = Path(__file__).resolve().parent / "addons"
COREDNS_MANIFEST = ADDONS / "coredns.yaml"
KUBE_ROUTER_RBAC = ADDONS / "kube-router-rbac.yaml"
# Seconds CoreDNS gets to become Ready (a pull from the local registry and a
# start; the apiserver's first list takes most of it).
COREDNS_READY_TIMEOUT_S = 120

Progress = Callable[[str], None]


class NodeNetwork:
    """The add-ons of one real node. Not thread-safe (driven by RealNode)."""

    def __init__(
        self,
        config: ClusterConfig,
        layout: Layout,
        lay: rn.NodeLayout,
        binaries: Binaries,
        progress: Progress,
        proc: Callable[[str, list[str]], ManagedProcess],
    ) -> None:
        self.config = config
        self.node = config.real_node
        self.layout = layout
        self.lay = lay
        self.binaries = binaries
        self.progress = progress
        self._proc = proc

    # -- processes ---------------------------------------------------------------
    def pod_registry(self) -> ManagedProcess:
        return self._proc("registry-pods", rn.registry_argv(self.lay, self.lay.pod_registry_config))

    def proxies(self) -> list[ManagedProcess]:
        """kube-proxy and kube-router (started once the node is registered)."""
        return [
            self._proc("kube-proxy", rn.kube_proxy_argv(self.binaries.kube_proxy, self.lay)),
            self._proc(
                "kube-router",
                rn.kube_router_argv(self.binaries.kube_router, self.config, self.lay),
            ),
        ]

    def health_checks(self) -> dict[str, Callable[[], bool]]:
        n = self.node
        return {
            "registry-pods": lambda: http_ok(f"http://{n.pod_registry}/v2/"),
            "kube-proxy": lambda: http_ok(f"http://127.0.0.1:{n.kube_proxy_healthz_port}/healthz"),
            # Its health server would bind every interface (off); metrics
            # answer once its controllers run.
            "kube-router": lambda: http_ok(
                f"http://127.0.0.1:{n.kube_router_metrics_port}/metrics"
            ),
        }

    # -- files ---------------------------------------------------------------------
    def write_files(self, server: str, now: dt.datetime) -> None:
        pki = self.layout.pki
        for name, user in (
            ("kube-proxy", "system:kube-proxy"),
            ("kube-router", "system:kube-router"),
        ):
            pki.ensure_cert(name, user, now=now, client=True)
        write_kubeconfig(
            self.lay.kube_proxy_kubeconfig,
            server=server,
            pki=pki,
            cert="kube-proxy",
            user="system:kube-proxy",
        )
        write_kubeconfig(
            self.lay.kube_router_kubeconfig,
            server=server,
            pki=pki,
            cert="kube-router",
            user="system:kube-router",
        )
        write_yaml(self.lay.kube_proxy_config, rn.kube_proxy_config(self.config, self.lay))
        write_yaml(self.lay.pod_registry_config, rn.pod_registry_config(self.node, self.lay))

    # -- host ----------------------------------------------------------------------
    def prepare_host(self) -> None:
        """After the bridge exists: netfilter on the bridge, forwarding, route, guard."""
        hostsetup.ensure_bridge_netfilter()
        hostsetup.enable_bridge_forwarding(self.node.bridge)
        hostsetup.route_via_bridge(self.node.bridge, SERVICE_CIDR, self.node.node_ip)
        hostsetup.ensure_egress_guard(self.node.bridge)

    def teardown(self) -> list[str]:
        """Remove what the proxies and ``prepare_host`` left (they must be stopped)."""
        problems = hostsetup.remove_kube_router_rules()
        if self.binaries.kube_proxy.exists():
            problems += hostsetup.remove_kube_proxy_rules(self.binaries.kube_proxy)
        hostsetup.remove_egress_guard()
        return problems

    # -- in-cluster parts ------------------------------------------------------------
    def kubectl_apply(self, text: str) -> None:
        proc = subprocess.run(
            [
                str(self.binaries.kubectl),
                f"--kubeconfig={self.layout.admin_kubeconfig}",
                "apply",
                "--server-side",
                "--field-manager=sandman-harness",
                "-f",
                "-",
            ],
            input=text,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise hostsetup.HostSetupError(f"kubectl apply failed: {proc.stderr.strip()}")

    def apply_rbac(self) -> None:
        self.kubectl_apply(KUBE_ROUTER_RBAC.read_text())

    def deploy_dns(self, image: str) -> None:
        text = COREDNS_MANIFEST.read_text()
        text = text.replace("IMAGE", image).replace("CLUSTER_DNS_IP", CLUSTER_DNS_IP)
        self.kubectl_apply(text)

    def wait_dns(self, timeout_s: float = COREDNS_READY_TIMEOUT_S) -> None:
        proc = subprocess.run(
            [
                str(self.binaries.kubectl),
                f"--kubeconfig={self.layout.admin_kubeconfig}",
                "-n",
                "kube-system",
                "rollout",
                "status",
                "deployment/coredns",
                f"--timeout={int(timeout_s)}s",
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise hostsetup.HostSetupError(
                f"CoreDNS did not become ready: {proc.stderr.strip() or proc.stdout.strip()}"
            )
