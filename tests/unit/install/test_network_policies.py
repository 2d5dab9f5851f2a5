"""The shipped NetworkPolicies, rendered by kustomize and evaluated on worked examples.

``allowed`` applies NetworkPolicy semantics (peers of a rule OR, a peer's
selectors AND, ipBlock minus its excepts, ports) to one connection, so each
case reads as "from a sandbox to X: allowed or not", the question a reviewer
asks. The local overlay's ranges are checked against the harness's own
(harness/cluster/config.py): one place decides them.
"""

from __future__ import annotations

import ipaddress
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandman.harness.cluster.config import KWOK_POD_CIDR, SERVICE_CIDR, RealNodeConfig
from sandman.harness.cluster.incluster import CLIENT_CA_CONFIGMAP
from sandman.harness.cluster.pki import ADMISSION_CLIENT_CN
from sandman.install import apply as ap

KUBECTL = Path.home() / ".cache/sandman/kube/v1.34.4/bin/kubectl"
pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="the harness's kubectl is not built")

SANDBOX = {"sandman.dev/sandbox": "true"}


def render(path: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(KUBECTL), "kustomize", str(ap.manifests_dir() / path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def policies(path: str) -> list[dict[str, Any]]:
    return [d for d in render(path) if d["kind"] == "NetworkPolicy"]


@dataclass(frozen=True)
class Pod:
    namespace: str
    ip: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def ns_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _peer(peer: dict[str, Any], pod: Pod, policy_ns: str) -> bool:
    if "ipBlock" in peer:
        ip = ipaddress.ip_address(pod.ip)
        block = peer["ipBlock"]
        if ip.version != ipaddress.ip_network(block["cidr"]).version:
            return False
        return ip in ipaddress.ip_network(block["cidr"]) and not any(
            ip in ipaddress.ip_network(x) for x in block.get("except") or []
        )
    if not pod.namespace:
        return False  # an address, not a pod: only an ipBlock matches it
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], pod.ns_labels):
            return False
    elif pod.namespace != policy_ns:
        return False
    return _selects(peer.get("podSelector") or {}, pod.labels)


def _port(ports: list[dict[str, Any]] | None, port: int, proto: str) -> bool:
    if not ports:
        return True
    return any(
        p.get("protocol", "TCP") == proto and p["port"] <= port <= p.get("endPort", p["port"])
        for p in ports
    )


def allowed(pols: list[dict[str, Any]], src: Pod, dst: Pod, port: int, proto: str = "TCP") -> bool:
    """Whether ``pols`` (applied in the namespaces they name) let src open port on dst."""

    def direction(kind: str, pod: Pod, peer_pod: Pod) -> bool:
        key = "egress" if kind == "Egress" else "ingress"
        side = "to" if kind == "Egress" else "from"
        mine = [
            p
            for p in pols
            if p["metadata"].get("namespace", pod.namespace) == pod.namespace
            and kind in p["spec"]["policyTypes"]
            and _selects(p["spec"]["podSelector"], pod.labels)
        ]
        if not mine:
            return True  # not isolated in this direction
        return any(
            _port(rule.get("ports"), port, proto)
            and (not rule.get(side) or any(_peer(x, peer_pod, pod.namespace) for x in rule[side]))
            for p in mine
            for rule in p["spec"].get(key) or []
        )

    return direction("Egress", src, dst) and direction("Ingress", dst, src)


def in_namespace(pols: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """The per-namespace policies (manifests/sandbox-namespace) applied in ``namespace``."""
    return [{**p, "metadata": {**p["metadata"], "namespace": namespace}} for p in pols]


# The local cluster's addresses (pods on 10.244.0.0/24, services 10.96.0.0/16).
NODE = RealNodeConfig().node_ip  # 10.244.0.1: the apiserver, the registry
SB = Pod("team", "10.244.0.20", SANDBOX)
WEBHOOK = Pod("sandman-system", "10.244.0.5", {"app.kubernetes.io/name": "sandman-webhook"})
EXTENDER = Pod("sandman-system", "10.244.0.6", {"app.kubernetes.io/name": "sandman-scheduler"})
REAPER = Pod("sandman-system", "10.244.0.7", {"app.kubernetes.io/name": "sandman-reaper"})
DNS = Pod("kube-system", "10.244.0.3", {"k8s-app": "kube-dns"})
OTHER_SYSTEM = Pod("kube-system", "10.244.0.4", {"app": "metrics-server"})
CLIENT = Pod("team", "10.244.0.21")  # the namespace's own client, not a sandbox
PROMETHEUS = Pod("monitoring", "10.244.0.30", {"app.kubernetes.io/name": "prometheus"})


def ip(address: str) -> Pod:
    """An address outside any namespace (a host, the internet, a ClusterIP)."""
    return Pod("", address)


@pytest.fixture(scope="module")
def local() -> list[dict[str, Any]]:
    return policies("overlays/local") + in_namespace(
        policies("overlays/local/sandbox-namespace"), "team"
    )


@pytest.mark.parametrize(
    ("dst", "port", "proto", "ok"),
    [
        # Sandman's components, on every port they serve: no.
        (WEBHOOK, 8443, "TCP", False),
        (EXTENDER, 8890, "TCP", False),
        (REAPER, 8080, "TCP", False),
        # kube-system: DNS on 53 (UDP and TCP) only.
        (DNS, 53, "UDP", True),
        (DNS, 53, "TCP", True),
        (DNS, 9153, "TCP", False),
        (OTHER_SYSTEM, 443, "TCP", False),
        (OTHER_SYSTEM, 53, "UDP", False),
        # The webhook's ClusterIP as an address: in the service range, excepted.
        (ip("10.96.0.77"), 443, "TCP", False),
        # Other namespaces' pods: their own policies decide.
        (CLIENT, 8080, "TCP", True),
        # The node: its registry yes; the apiserver and the kubelet (the
        # control plane) no.
        (ip(NODE), 5000, "TCP", True),
        (ip(NODE), 16443, "TCP", False),
        (ip(NODE), 10250, "TCP", False),
        # The internet: yes.
        (ip("93.184.216.34"), 443, "TCP", True),
        # Metadata services, Azure's WireServer among them: no.
        (ip("169.254.169.254"), 80, "TCP", False),
        (ip("168.63.129.16"), 80, "TCP", False),
        # A kwok pod's address (never routed, but a pod): no.
        (ip("10.160.0.9"), 80, "TCP", False),
    ],
)
def test_from_a_sandbox(
    local: list[dict[str, Any]], dst: Pod, port: int, proto: str, ok: bool
) -> None:
    assert allowed(local, SB, dst, port, proto) is ok


def test_into_sandman_system(local: list[dict[str, Any]]) -> None:
    # The apiserver (the node's address on the local cluster) reaches the webhook.
    assert allowed(local, ip(NODE), WEBHOOK, 8443)
    # A managed control plane elsewhere: outside the pod and service ranges.
    assert allowed(local, ip("172.20.0.10"), WEBHOOK, 8443)
    # Sandman's own pods reach each other (the reaper probes the webhook's /readyz).
    assert allowed(local, REAPER, WEBHOOK, 8443)
    # A pod that is not a sandbox: the extender (pools ask it), not the webhook.
    assert allowed(local, CLIENT, EXTENDER, 8890)
    assert not allowed(local, CLIENT, WEBHOOK, 8443)
    assert not allowed(local, CLIENT, REAPER, 8080)
    # Prometheus, once manifests/monitoring's policy is there.
    assert not allowed(local, PROMETHEUS, WEBHOOK, 8443)
    with_monitoring = local + policies("monitoring")
    assert allowed(with_monitoring, PROMETHEUS, WEBHOOK, 8443)
    assert allowed(with_monitoring, PROMETHEUS, REAPER, 8080)
    # ...but not a sandbox that calls itself Prometheus.
    fake = Pod("team", "10.244.0.22", {**SANDBOX, "app.kubernetes.io/name": "prometheus"})
    assert not allowed(with_monitoring, fake, WEBHOOK, 8443)


def test_the_shipped_defaults_keep_the_same_boundaries() -> None:
    """Without the local overlay: kubeadm/kind ranges (10.244.0.0/16, 10.96.0.0/12)."""
    pols = policies("") + in_namespace(policies("sandbox-namespace"), "team")
    assert not allowed(pols, SB, WEBHOOK, 8443)
    assert not allowed(pols, SB, ip("10.100.0.1"), 443)  # service range
    assert not allowed(pols, SB, OTHER_SYSTEM, 443)
    assert allowed(pols, SB, DNS, 53, "UDP")
    assert allowed(pols, ip("172.20.0.10"), WEBHOOK, 8443)
    assert not allowed(pols, ip("10.244.3.3"), WEBHOOK, 8443)  # a pod elsewhere


def test_the_local_overlay_uses_the_harness_ranges_and_the_apiserver_ca() -> None:
    egress = next(
        p
        for p in policies("overlays/local/sandbox-namespace")
        if p["metadata"]["name"] == "sandman-sandboxes-egress"
    )
    block = egress["spec"]["egress"][0]["to"][1]["ipBlock"]
    assert block["cidr"] == "0.0.0.0/0"
    assert {RealNodeConfig().pod_cidr, SERVICE_CIDR, KWOK_POD_CIDR} <= set(block["except"])
    docs = render("overlays/local")
    webhook = next(
        d for d in docs if d["kind"] == "Deployment" and "webhook" in d["metadata"]["name"]
    )
    spec = webhook["spec"]["template"]["spec"]
    args = spec["containers"][0]["args"]
    assert "--client-ca-file=/etc/sandman/apiserver-client-ca/ca.crt" in args
    assert f"--client-cn={ADMISSION_CLIENT_CN}" in args
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["apiserver-client-ca"]["configMap"]["name"] == CLIENT_CA_CONFIGMAP
