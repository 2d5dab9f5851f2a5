"""The real node's network settings and teardown commands (pure parts)."""

from __future__ import annotations

from pathlib import Path

from sandman.harness.cluster import hostsetup
from sandman.harness.cluster import realnode as rn
from sandman.harness.cluster.components import CLUSTER_DNS_IP, apiserver_address, apiserver_argv
from sandman.harness.cluster.config import ClusterConfig, RealNodeConfig

CFG = ClusterConfig(state_dir=Path("/tmp/x"), real_node=RealNodeConfig(enabled=True))
LAY = rn.NodeLayout(Path("/tmp/x/node"))

# An `iptables-save -t filter` as kube-router v2.1.0 leaves it (trimmed), next
# to kube-proxy's and a chain of nobody's.
FILTER = """\
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NWPLCY-DEFAULT - [0:0]
:KUBE-POD-FW-ABCDEF0123456789 - [0:0]
:KUBE-ROUTER-FORWARD - [0:0]
:KUBE-ROUTER-INPUT - [0:0]
:OTHER - [0:0]
-A INPUT -m comment --comment "kube-router netpol - 4IA2OSFRMVNDXBVV" -j KUBE-ROUTER-INPUT
-A FORWARD -m comment --comment "kube-router netpol - TEMCG2JMHZYE7H7T" -j KUBE-ROUTER-FORWARD
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A KUBE-ROUTER-FORWARD -d 10.244.0.3/32 -j KUBE-POD-FW-ABCDEF0123456789
COMMIT
"""


def test_kube_router_cleanup_removes_its_jumps_chains_and_sets_only() -> None:
    cmds = hostsetup.kube_router_cleanup_commands(
        FILTER, ["KUBE-SRC-AAA", "KUBE-DST-BBB", "my-set"]
    )
    deletes = [c for c in cmds if "-D" in c]
    # The jumps, with their exact rule spec (the comment carries a hash).
    assert deletes == [
        ["iptables", "-t", "filter", "-D", "INPUT", "-m", "comment", "--comment",
         "kube-router netpol - 4IA2OSFRMVNDXBVV", "-j", "KUBE-ROUTER-INPUT"],
        ["iptables", "-t", "filter", "-D", "FORWARD", "-m", "comment", "--comment",
         "kube-router netpol - TEMCG2JMHZYE7H7T", "-j", "KUBE-ROUTER-FORWARD"],
    ]  # fmt: skip
    chains = {"KUBE-NWPLCY-DEFAULT", "KUBE-POD-FW-ABCDEF0123456789", "KUBE-ROUTER-FORWARD",
              "KUBE-ROUTER-INPUT"}  # fmt: skip
    ipt = [c for c in cmds if c[0] == "iptables"]
    flushed = [c[-1] for c in ipt if c[3] == "-F"]
    removed = [c[-1] for c in ipt if c[3] == "-X"]
    assert set(flushed) == set(removed) == chains  # kube-proxy's and OTHER stay
    # Every chain is flushed before any is deleted (they jump to each other).
    assert max(cmds.index(c) for c in ipt if c[3] == "-F") < min(
        cmds.index(c) for c in ipt if c[3] == "-X"
    )
    assert [c for c in cmds if c[0] == "ipset"] == [
        ["ipset", "destroy", "KUBE-SRC-AAA"],
        ["ipset", "destroy", "KUBE-DST-BBB"],
    ]


def test_guard_drops_what_leaves_the_bridge_only() -> None:
    rules = hostsetup.guard_ruleset("sandman0")
    assert 'iifname "sandman0" oifname != "sandman0" counter drop' in rules
    assert "priority filter - 10" in rules


def test_pods_get_a_route_to_services_and_nothing_else() -> None:
    ipam = rn.cni_conflist(CFG.real_node, LAY)["plugins"][0]["ipam"]
    assert ipam["routes"] == [{"dst": "10.96.0.0/16", "gw": "10.244.0.1"}]
    assert rn.cni_conflist(CFG.real_node, LAY)["plugins"][0]["isGateway"] is False


def test_kubelet_points_pods_at_cluster_dns() -> None:
    kc = rn.kubelet_config(CFG, LAY, Path("/pki"))
    assert kc["clusterDNS"] == [CLUSTER_DNS_IP] == ["10.96.0.10"]
    assert kc["clusterDomain"] == "cluster.local"


def test_kube_proxy_listens_on_loopback_and_leaves_host_sysctls() -> None:
    kp = rn.kube_proxy_config(CFG, LAY)
    assert kp["healthzBindAddress"].startswith("127.0.0.1:")
    assert kp["metricsBindAddress"].startswith("127.0.0.1:")
    assert kp["iptables"]["localhostNodePorts"] is False  # no route_localnet
    assert kp["nodePortAddresses"] == ["10.244.0.1/32"]
    assert all(v in (0, "0s", False) for v in kp["conntrack"].values())  # 0: leave as is
    argv = rn.kube_router_argv(Path("/kr"), CFG, LAY)
    assert "--health-port=0" in argv and "--metrics-addr=127.0.0.1" in argv
    assert "--run-router=false" in argv and "--run-service-proxy=false" in argv


def test_apiserver_binds_the_bridge_with_the_real_node_and_loopback_without() -> None:
    from sandman.harness.cluster.binaries import Binaries
    from sandman.harness.cluster.components import Layout

    bins = Binaries.in_cache(Path("/c"), CFG.versions)
    with_node = apiserver_argv(CFG, bins, Layout(CFG.state_dir))
    assert "--bind-address=10.244.0.1" in with_node
    assert not any(a.startswith("--endpoint-reconciler-type") for a in with_node)
    plain = ClusterConfig(state_dir=Path("/tmp/y"))
    assert apiserver_address(plain) == "127.0.0.1"
    assert "--endpoint-reconciler-type=none" in apiserver_argv(plain, bins, Layout(plain.state_dir))
    assert all("0.0.0.0" not in a for a in with_node)


def test_pod_registry_is_read_only_on_the_bridge() -> None:
    doc = rn.pod_registry_config(CFG.real_node, LAY)
    assert doc["http"]["addr"] == "10.244.0.1:5000"
    assert doc["storage"]["maintenance"]["readonly"]["enabled"] is True
    assert (
        doc["storage"]["filesystem"]
        == rn.registry_config(CFG.real_node, LAY)["storage"]["filesystem"]
    )
