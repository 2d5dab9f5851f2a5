"""Sandboxes on the real node cannot reach each other's daemon, nor sniff it (issue 15 item 8).

The shipped NetworkPolicy (manifests/sandbox-namespace) is enforced by a real
enforcer, kube-router's network-policy controller on the local cluster: a
sandbox's connection to another sandbox's port 7878 is refused while the
namespace's client still connects; its egress exceptions (the cloud metadata
addresses, which cannot be served here) are shown working on a stand-in
address, the node's registry on the bridge. Injected containers lack
NET_RAW, so a root agent cannot forge ARP on the bridge to read its
neighbours' requests.

Nothing inside a sandbox reaches Sandman's own components nor kube-system
(but DNS): the sandbox egress policy leaves both namespaces (and the pod and
service ranges) out, and sandman-system's own ingress policies
(manifests/base/networkpolicy.yaml) let in only the control plane, Sandman's
pods and, for the extender, pods that are not sandboxes. The reaper does not
run in test sessions (tests run their own), so a stand-in pod listens on its
port; kube-system gets a stand-in too, besides CoreDNS's metrics port.
The local cluster's ranges come from manifests/overlays/local/sandbox-namespace.
"""

from __future__ import annotations

import copy
import socket
from typing import Any

import yaml
from kubernetes.client import CoreV1Api, NetworkingV1Api
from kubernetes.client.exceptions import ApiException

from sandman import tokens
from sandman.contract import ANN_KEY_ID, LABEL_ID, LABEL_SANDBOX, NAMESPACE
from sandman.harness.cluster.deploy import MANIFESTS
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.kube import api_client, raw
from sandman.harness.testing import kubectl, real_pod, wait_for, wait_ready
from tests.e2e.test_sandbox import call

# The shipped sandbox policies with the local cluster's address ranges.
LOCAL_POLICIES = MANIFESTS / "overlays" / "local" / "sandbox-namespace"
MONITORING_POLICY = MANIFESTS / "monitoring" / "networkpolicy.yaml"
NODE_PEER = {"ipBlock": {"cidr": "10.244.0.1/32"}}  # the local overlay's node peer
# ...in a rule of its own, on the node's registry port only.
NODE_RULE = {"to": [NODE_PEER], "ports": [{"protocol": "TCP", "port": 5000}]}
NET_RAW = 13  # capabilities(7): CAP_NET_RAW
# The node's read-only registry on the bridge: an address a pod can reach
# that is not a pod (a stand-in for 169.254.169.254, which nothing serves here).
STAND_IN = "10.244.0.1"
# busybox's nc, not its wget: Debian's static busybox wget crashes (SIGSEGV)
# on any URL, which would read as "refused".
NC_TIMEOUT_S = 3


def http_get(ip: str, port: int, path: str) -> str:
    """A shell line that prints the HTTP response, or fails to connect."""
    request = f"GET {path} HTTP/1.1\\r\\nHost: {ip}\\r\\nConnection: close\\r\\n\\r\\n"
    return f"printf '{request}' | nc -w {NC_TIMEOUT_S} {ip} {port}"


def answered(out: dict[str, Any]) -> bool:
    return out["exit_code"] == 0 and "HTTP/1." in out["stdout"]


def not_connected(out: dict[str, Any]) -> bool:
    """nc ran and could not connect (not a crash, not an HTTP answer)."""
    text = out["stdout"] + out["stderr"]
    return out["exit_code"] == 1 and "HTTP/1." not in text and "egmentation" not in text


def tcp(ip: str, port: int) -> str:
    """A shell line that connects, writes a line and waits for the peer to
    close: exit 0 once connected (an HTTP server answers 400, a TLS server
    drops the handshake), 1 when the connection cannot be made."""
    return f"printf 'x\\r\\n\\r\\n' | nc -w {NC_TIMEOUT_S} {ip} {port}"


def local_policies(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    """The sandbox-namespace policies as the local cluster applies them."""
    out = kubectl(cluster, "kustomize", str(LOCAL_POLICIES))
    docs = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "NetworkPolicy"]
    return {d["metadata"]["name"]: d for d in docs}


def _sandbox(core: CoreV1Api, ns: str, name: str, image: str) -> dict[str, Any]:
    pod = real_pod(name, image, ["sleep", "3600"])
    pod["metadata"]["labels"] = {LABEL_SANDBOX: "true"}
    core.create_namespaced_pod(ns, pod)
    return wait_ready(core, ns, name, timeout=180)


def _token(core: CoreV1Api, ns: str, pod: dict[str, Any]) -> str:
    secret = wait_for(
        lambda: core.read_namespaced_secret(tokens.ACCESS_SECRET, ns).data, timeout=30
    )
    keys = tokens.AccessKeys.from_secret_data(secret)
    kid = pod["metadata"]["annotations"].get(ANN_KEY_ID)
    return tokens.sandbox_token(keys.key_for(kid), pod["metadata"]["labels"][LABEL_ID])


def _run(pod: dict[str, Any], token: str, script: str) -> dict[str, Any]:
    """``sh -c script`` inside the sandbox (from the host, as its client would)."""
    status, out = call(
        pod["status"]["podIP"], token, "/v1/exec", {"cmd": ["sh", "-c", script], "timeout_s": 20}
    )
    assert status == 200, out
    return out


def test_sandboxes_cannot_reach_each_other_but_the_namespace_client_can(
    cluster: LocalCluster,
    real_node: RealNode,
    core: CoreV1Api,
    namespace: str,
    images: dict[str, str],
) -> None:
    policies = local_policies(cluster)
    net = NetworkingV1Api(api_client(cluster.kubeconfig))
    for policy in policies.values():
        net.create_namespaced_network_policy(namespace, policy)
    a = _sandbox(core, namespace, "a", images["tiny"])
    b = _sandbox(core, namespace, "b", images["tiny"])
    token_b = _token(core, namespace, b)
    to_a = http_get(a["status"]["podIP"], 7878, "/healthz")
    to_stand_in = http_get(STAND_IN, 5000, "/v2/")
    # The tool works from b: the node's registry answers.
    assert answered(_run(b, token_b, to_stand_in))

    # Sandbox b -> sandbox a's daemon: refused once kube-router has the pods'
    # rules (a new pod is unfiltered for a moment, hence the wait).
    wait_for(
        lambda: not_connected(_run(b, token_b, to_a)),
        timeout=60,
        what="sandbox-to-sandbox 7878 refused",
    )
    # ...and stays refused, while the host (the node: kubelet probes, the
    # test's own client) still gets an answer from a.
    assert not_connected(_run(b, token_b, to_a))

    # The namespace's client (a pod that is not a sandbox) still connects. It
    # retries: until kube-router has added its new IP to the allowed peers,
    # its packets are dropped like anyone's.
    script = (
        f"i=0; while [ $i -lt 60 ]; do {to_a} > /tmp/r; grep -q ok /tmp/r && "
        "cat /tmp/r && exit 0; i=$((i+1)); sleep 1; done; cat /tmp/r; exit 1"
    )
    client = real_pod("client", images["tiny"], ["sh", "-c", script])
    client["spec"]["restartPolicy"] = "Never"
    core.create_namespaced_pod(namespace, client)

    def finished() -> str | None:
        pod = raw(core.read_namespaced_pod("client", namespace, _preload_content=False))
        phase = pod["status"].get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(finished, timeout=180, what="client done")
    logs = core.read_namespaced_pod_log("client", namespace)
    assert phase == "Succeeded", logs
    assert '"ok": true' in logs or '"ok":true' in logs, logs

    # Egress: the stand-in address is reachable as shipped, and refused once
    # it is in the policy's except list like the metadata addresses (and the
    # local overlay's peer for the node, which it is, is gone).
    assert answered(_run(b, token_b, to_stand_in))
    blocked = copy.deepcopy(policies["sandman-sandboxes-egress"])
    blocked["spec"]["egress"].remove(NODE_RULE)
    for peer in blocked["spec"]["egress"][0]["to"]:
        block = peer.get("ipBlock") or {}
        if block.get("cidr") == "0.0.0.0/0":
            block["except"].append(f"{STAND_IN}/32")
    net.replace_namespaced_network_policy("sandman-sandboxes-egress", namespace, blocked)

    def egress_refused() -> bool:
        return not_connected(_run(b, token_b, to_stand_in))

    wait_for(egress_refused, timeout=60, what="egress to the excepted address refused")


def test_injected_containers_lack_net_raw(
    real_node: RealNode, core: CoreV1Api, namespace: str, images: dict[str, str]
) -> None:
    pod = _sandbox(core, namespace, "caps", images["tiny"])
    out = _run(pod, _token(core, namespace, pod), "grep -E '^Cap(Eff|Bnd):' /proc/self/status")
    assert out["exit_code"] == 0, out
    for line in out["stdout"].splitlines():
        field, value = line.split(":")
        assert not int(value.strip(), 16) & (1 << NET_RAW), f"{field} has NET_RAW: {line}"
    # What an agent would try: raw sockets (ping) fail.
    ping = _run(pod, _token(core, namespace, pod), f"ping -c 1 -W 1 {STAND_IN}")
    assert ping["exit_code"] != 0 and "permission" in (ping["stderr"] + ping["stdout"]).lower()


# A pod that answers HTTP on ``port``, restricted enough for sandman-system's
# Pod Security level (busybox httpd serving its own root).
# /cgi-bin/addr answers the caller's address as the pod sees it.
CGI_ADDR = "#!/bin/sh\necho Content-Type: text/plain\necho\necho $REMOTE_ADDR\n"


def _stand_in(
    core: CoreV1Api, ns: str, name: str, labels: dict[str, str], port: int, image: str
) -> str:
    """Its pod IP, once Ready."""
    script = (
        "mkdir -p /www/cgi-bin && printf '%s' \"$CGI\" > /www/cgi-bin/addr && "
        f"chmod +x /www/cgi-bin/addr && exec httpd -f -p {port} -h /www"
    )
    pod = real_pod(name, image, ["sh", "-c", script])
    pod["spec"]["containers"][0]["env"] = [{"name": "CGI", "value": CGI_ADDR}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "www", "mountPath": "/www"}]
    pod["spec"]["volumes"] = [{"name": "www", "emptyDir": {}}]
    pod["metadata"]["labels"] = labels
    pod["spec"]["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    pod["spec"]["containers"][0]["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    core.create_namespaced_pod(ns, pod)
    return str(wait_ready(core, ns, name, timeout=180)["status"]["podIP"])


def _pod_ips(core: CoreV1Api, ns: str, selector: str) -> list[str]:
    pods = raw(core.list_namespaced_pod(ns, label_selector=selector, _preload_content=False))
    return [p["status"]["podIP"] for p in pods["items"] if p["status"].get("podIP")]


def _listens(ip: str, port: int) -> bool:
    """From the host (which every enforcer lets through): the target is there."""
    try:
        socket.create_connection((ip, port), timeout=NC_TIMEOUT_S).close()
    except OSError:
        return False
    return True


def test_sandboxes_reach_neither_sandmans_components_nor_kube_system_but_dns(
    cluster: LocalCluster,
    real_node: RealNode,
    core: CoreV1Api,
    namespace: str,
    images: dict[str, str],
) -> None:
    net = NetworkingV1Api(api_client(cluster.kubeconfig))
    for policy in local_policies(cluster).values():
        net.create_namespaced_network_policy(namespace, policy)
    reaper = "sandman-stand-in-reaper"
    system = "sandman-stand-in-system"
    stand_ins = [(NAMESPACE, reaper), ("kube-system", system)]
    try:
        img = images["tiny"]
        reaper_ip = _stand_in(
            core, NAMESPACE, reaper, {"app.kubernetes.io/name": reaper}, 8080, img
        )
        system_ip = _stand_in(core, "kube-system", system, {"app": system}, 8080, img)
        webhook_svc = core.read_namespaced_service("sandman-webhook", NAMESPACE).spec.cluster_ip
        webhooks = _pod_ips(core, NAMESPACE, "app.kubernetes.io/name=sandman-webhook")
        extenders = _pod_ips(core, NAMESPACE, "app.kubernetes.io/name=sandman-scheduler")
        dns_pods = _pod_ips(core, "kube-system", "k8s-app=kube-dns")
        apiserver_svc = core.read_namespaced_service("kubernetes", "default").spec.cluster_ip
        targets = [
            ("webhook Service", webhook_svc, 443),
            *(("webhook pod", ip, 8443) for ip in webhooks),
            *(("extender pod", ip, 8890) for ip in extenders),
            ("reaper port (stand-in)", reaper_ip, 8080),
            ("kube-system pod (stand-in)", system_ip, 8080),
            *(("CoreDNS metrics", ip, 9153) for ip in dns_pods),
            # The control plane: the apiserver by its Service and on the node,
            # the kubelet on the node.
            ("apiserver Service", apiserver_svc, 443),
            ("apiserver", STAND_IN, cluster.config.ports.apiserver),
            ("kubelet", STAND_IN, 10250),
        ]
        kinds = {what for what, _, _ in targets}
        assert {"webhook pod", "extender pod", "CoreDNS metrics"} <= kinds, targets
        for what, ip, port in targets:
            assert _listens(ip, port), f"{what} {ip}:{port} does not listen: no proof below"

        sb = _sandbox(core, namespace, "sb", images["tiny"])
        token = _token(core, namespace, sb)
        # The tool connects where the policies allow: the node's registry.
        assert _run(sb, token, tcp(STAND_IN, 5000))["exit_code"] == 0
        for what, ip, port in targets:
            # A new pod is unfiltered for a moment (kube-router adds its rules).
            wait_for(
                lambda ip=ip, port=port: not_connected(_run(sb, token, tcp(ip, port))),
                timeout=60,
                what=f"sandbox -> {what} {ip}:{port} refused",
            )
        for what, ip, port in targets:  # ...and stays refused
            assert not_connected(_run(sb, token, tcp(ip, port))), f"{what} {ip}:{port}"
        # DNS, the one way into kube-system, still resolves.
        dns = _run(sb, token, f"nslookup sandman-webhook.{NAMESPACE}.svc.cluster.local")
        assert dns["exit_code"] == 0 and webhook_svc in dns["stdout"], dns
        # The apiserver (a host process) reaches sandman-system's pods through
        # the default deny, from the node's bridge address: the address
        # manifests/overlays/local lets in to the webhook (kube-router also
        # admits whatever the node itself sends).
        seen = core.connect_get_namespaced_pod_proxy_with_path(
            f"{reaper}:8080", NAMESPACE, "cgi-bin/addr"
        )
        # busybox httpd listens dual-stack: "[::ffff:10.244.0.1]".
        address = str(seen).strip().strip("[]").removeprefix("::ffff:")
        assert address == NODE_PEER["ipBlock"]["cidr"].split("/")[0], seen
    finally:
        for ns, name in stand_ins:
            try:
                core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            except ApiException as e:
                if e.status != 404:
                    raise


def test_prometheus_still_reaches_the_webhooks_metrics_port(
    cluster: LocalCluster,
    real_node: RealNode,
    core: CoreV1Api,
    namespace: str,
    images: dict[str, str],
) -> None:
    """With manifests/monitoring's policy, a Prometheus pod (not a sandbox) in
    another namespace connects to the webhook's port; sandman-system's
    default deny does not starve the scrape."""
    doc = yaml.safe_load(MONITORING_POLICY.read_text())
    net = NetworkingV1Api(api_client(cluster.kubeconfig))
    net.create_namespaced_network_policy(NAMESPACE, doc)
    try:
        ip = _pod_ips(core, NAMESPACE, "app.kubernetes.io/name=sandman-webhook")[0]
        # Retried: until kube-router has the new pod's IP among the allowed
        # peers, its packets are dropped like anyone's.
        script = (
            f"i=0; while [ $i -lt 60 ]; do {tcp(ip, 8443)} && echo connected && exit 0; "
            "i=$((i+1)); sleep 1; done; exit 1"
        )
        prom = real_pod("prometheus", images["tiny"], ["sh", "-c", script])
        prom["metadata"]["labels"] = {"app.kubernetes.io/name": "prometheus"}
        prom["spec"]["restartPolicy"] = "Never"
        core.create_namespaced_pod(namespace, prom)

        def finished() -> str | None:
            pod = raw(core.read_namespaced_pod("prometheus", namespace, _preload_content=False))
            phase = pod["status"].get("phase")
            return phase if phase in ("Succeeded", "Failed") else None

        phase = wait_for(finished, timeout=180, what="the scrape attempt done")
        logs = core.read_namespaced_pod_log("prometheus", namespace)
        assert phase == "Succeeded" and "connected" in logs, logs
    finally:
        net.delete_namespaced_network_policy(doc["metadata"]["name"], NAMESPACE)
