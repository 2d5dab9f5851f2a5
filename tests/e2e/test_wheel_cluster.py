"""A wheel-built install on the real node, from a registry that wants credentials.

What a platform team does on day one, with only the wheel (tests/wheel.py:
built from this tree, installed in a venv outside the checkout):

1. `sandman image push` every component to its registry, which wants a login
   (htpasswd basic auth over TLS, Debian's docker-registry). The real node's
   containerd reaches it on the host's loopback as it reaches the harness's
   127.0.0.1:5000, through a ``certs.d/HOST/hosts.toml`` (here naming the
   registry's CA).
2. `sandman install --registry ... --allow-registry 'HOST/*' --registry-auth
   FILE`: the policy is the one the install writes from --allow-registry;
   the login becomes a pull Secret in sandman-system that Sandman's pods use
   (nothing else on the node can pull those images: they are new to it).
3. A sandbox from a task image in the same registry: the namespace holds the
   pull Secret by the name the install printed (as docs/install.md says), and
   the webhook names it in the pod for the daemon image, which the kubelet
   pulls in the sandbox's namespace. Ready; `sandman exec` from the wheel
   runs a command and passes its exit code through.
4. An image from a registry the policy does not list is denied, naming the
   rule set and the rule.
5. `sandman uninstall --overlay-dir` removes it all.

The session's own in-cluster Sandman (harness/cluster/incluster.py) is
uninstalled first and put back afterwards, at its version and policy, as
test_upgrade.py leaves it: the two installs use the same names.

The loopback registry makes the installed policy admit a loopback registry
only, which `sandman install` refuses unless told the cluster is the local
harness (--local-harness): it is.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import CoreV1Api, NetworkingV1Api
from kubernetes.client.exceptions import ApiException

from sandman import __version__
from sandman.contract import DAEMON_INIT_CONTAINER, LABEL_SANDBOX, NAMESPACE
from sandman.harness.cluster import overlay
from sandman.harness.cluster.incluster import WEBHOOK, WEBHOOK_PORT, InClusterDeployment
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.images import registry as reg
from sandman.harness.images.build import ImageBuilder
from sandman.harness.kube import api_client, raw
from sandman.harness.testing import wait_ready
from sandman.install import apply as ap
from sandman.install.pullsecrets import REGISTRY_AUTH_SECRET
from tests.e2e.test_incluster import incluster  # noqa: F401  (the fixture)
from tests.wheel import Run, ok, runner, wheel_venv

USER, PASSWORD = "platform", "pulling-is-a-privilege"
PREFIX = "acme/sandman"


def hosts_toml(host: str, ca: Path) -> str:
    """containerd's config for the registry: HTTPS, verified against its CA."""
    return (
        f'server = "https://{host}"\n\n[host."https://{host}"]\n'
        f'  capabilities = ["pull", "resolve"]\n  ca = "{ca}"\n'
    )


@pytest.fixture(scope="module")
def private_registry(
    tmp_path_factory: pytest.TempPathFactory, real_node: RealNode
) -> Iterator[reg.Registry]:
    for tool in ("docker-registry", "skopeo"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing (python -m sandman.harness.prereqs installs it)")
    root = tmp_path_factory.mktemp("private-registry")
    with reg.serve(root, username=USER, password=PASSWORD, tls=True) as r:
        assert r.ca_file is not None
        hosts = real_node.lay.registry_hosts_dir / r.host
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "hosts.toml").write_text(hosts_toml(r.host, r.ca_file))
        try:
            yield r
        finally:
            shutil.rmtree(hosts, ignore_errors=True)


@pytest.fixture(scope="module")
def wheel_sandman(tmp_path_factory: pytest.TempPathFactory, cluster: LocalCluster) -> Run:
    """The wheel's `sandman`, pointed at the cluster by $KUBECONFIG. Its image
    cache is the machine's (layers are keyed by content, so the images the
    harness built are not built again)."""
    venv = wheel_venv(tmp_path_factory.mktemp("dist"))
    workdir = tmp_path_factory.mktemp("platform-team")
    (workdir / "home").mkdir()
    return runner(
        venv, workdir, workdir / "home", cluster.config.cache_dir,
        KUBECONFIG=str(cluster.kubeconfig),
    )  # fmt: skip


def _apiserver_policy(node_ip: str) -> dict[str, object]:
    """The local cluster's apiserver is a host process on the pod bridge, inside
    the pod range that the shipped sandman-webhook-from-control-plane treats as
    pods (docs/install.md, "Network policies"): an admin's policy beside it
    lets that one address in (policies add up)."""
    return {
        "metadata": {"name": "apiserver-to-webhook", "namespace": NAMESPACE},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": WEBHOOK}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "ports": [{"protocol": "TCP", "port": WEBHOOK_PORT}],
                    "from": [{"ipBlock": {"cidr": f"{node_ip}/32"}}],
                }
            ],
        },
    }


def _denial(core: CoreV1Api, namespace: str, image: str) -> str:
    body = {
        "metadata": {"name": "unlisted", "labels": {LABEL_SANDBOX: "true"}},
        "spec": {"containers": [{"name": "main", "image": image, "command": ["true"]}]},
    }
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod(namespace, body)
    return str(e.value.body)


def _ready_or_why(core: CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    """The pod once Ready; else the test fails with the namespace's Events (a
    pull refused for want of credentials says so there, and the installed
    reaper deletes a sandbox whose pulls keep failing)."""
    try:
        return wait_ready(core, namespace, name, timeout=180)
    except Exception as e:  # a timeout, or the pod gone
        events = core.list_namespaced_event(namespace).items
        lines = [f"{ev.involved_object.name}: {ev.reason}: {ev.message}" for ev in events]
        pytest.fail(f"sandbox {namespace}/{name} never Ready ({e}); events:\n" + "\n".join(lines))


def test_a_wheel_install_from_a_private_registry_runs_sandboxes(
    cluster: LocalCluster,
    real_node: RealNode,
    incluster: InClusterDeployment,  # noqa: F811
    core: CoreV1Api,
    namespace: str,
    images: dict[str, str],
    private_registry: reg.Registry,
    wheel_sandman: Run,
    tmp_path: Path,
) -> None:
    sandman = wheel_sandman
    kubectl = incluster.kubectl
    host = private_registry.host
    old_version, old_policy = incluster.version, incluster.policy.read()
    harness_docs = overlay.rendered(kubectl, overlay.path(cluster.config))
    login = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    auth = tmp_path / "config.json"
    auth.write_text(json.dumps({"auths": {host: {"auth": login}}}))
    overlay_dir = tmp_path / "sandman-overlay"
    try:
        ap.uninstall(kubectl, harness_docs, progress=lambda _m: None)

        # 1. The components, pushed with the login; the task image beside them.
        target = f"{host}/{PREFIX}"
        ok(sandman("image", "push", "--registry", target, "--username", USER,
                   "--password-stdin", "--ca-file", str(private_registry.ca_file),
                   stdin=PASSWORD + "\n"))  # fmt: skip
        task_image = (
            ImageBuilder(cluster.config.cache_dir).build_and_push("tiny", private_registry).ref
        )
        assert task_image.startswith(f"{host}/")

        # 2. The install, from the wheel.
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        NetworkingV1Api(api_client(cluster.kubeconfig)).create_namespaced_network_policy(
            NAMESPACE, _apiserver_policy(cluster.config.real_node.node_ip)
        )
        proc = sandman(
            "install", "--registry", target, "--allow-registry", f"{host}/*",
            "--local-harness", "--registry-auth", str(auth),
            "--overlay-dir", str(overlay_dir), "--kubectl", str(cluster.binaries.kubectl),
            timeout=600,
        )  # fmt: skip
        ok(proc)
        err = proc.stderr
        assert f"registries {host}/*" in err, err
        assert f"image pull secrets: {REGISTRY_AUTH_SECRET}" in err
        assert "Sandman is installed" in err
        written = "".join(p.read_text() for p in overlay_dir.rglob("*") if p.is_file())
        for text in (proc.stdout, err, written):
            assert login not in text and PASSWORD not in text
        webhook = raw(core.list_namespaced_pod(
            NAMESPACE, label_selector=f"app.kubernetes.io/name={WEBHOOK}",
            _preload_content=False,
        ))["items"][0]  # fmt: skip
        assert webhook["spec"]["containers"][0]["image"] == (
            f"{target}/sandman-controller:{__version__}"
        )
        assert webhook["spec"]["imagePullSecrets"] == [{"name": REGISTRY_AUTH_SECRET}]

        # 3. A sandbox in a namespace that holds the pull Secret.
        core.create_namespaced_secret(
            namespace,
            {
                "metadata": {"name": REGISTRY_AUTH_SECRET},
                "type": "kubernetes.io/dockerconfigjson",
                "data": {".dockerconfigjson": base64.b64encode(auth.read_bytes()).decode()},
            },
        )
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "private", "labels": {LABEL_SANDBOX: "true"}},
                "spec": {
                    "nodeSelector": {"sandman.dev/node-kind": "real"},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {"name": "main", "image": task_image, "command": ["sleep", "3600"]}
                    ],
                },
            },
        )
        pod = _ready_or_why(core, namespace, "private")
        spec = pod["spec"]
        assert spec["imagePullSecrets"] == [{"name": REGISTRY_AUTH_SECRET}]
        (init,) = [c for c in spec["initContainers"] if c["name"] == DAEMON_INIT_CONTAINER]
        assert init["image"] == f"{target}/sandman-daemon:{__version__}"
        out = ok(sandman("exec", "-n", namespace, "private", "--",
                         "sh", "-c", "echo hello from $(hostname)"))  # fmt: skip
        assert out.strip() == "hello from private", out
        code = sandman("exec", "-n", namespace, "private", "--", "sh", "-c", "exit 7")
        assert code.returncode == 7, (code.stdout, code.stderr)

        # 4. Registries the installed policy does not list.
        for image in (images["tiny"], "busybox:1.36"):
            denial = _denial(core, namespace, image)
            assert "sandman policy 'default'" in denial and "[registry]" in denial, denial
            assert "is not from an allowed registry" in denial

        # 5. Removed.
        proc = sandman("uninstall", "--overlay-dir", str(overlay_dir),
                       "--kubectl", str(cluster.binaries.kubectl), timeout=600)  # fmt: skip
        ok(proc)
        left = kubectl.run("get", "mutatingwebhookconfigurations,namespaces", "-o", "name")
        assert "mutatingwebhookconfiguration.admissionregistration.k8s.io/sandman" not in (
            left.stdout
        )
        assert f"namespace/{NAMESPACE}\n" not in left.stdout
    finally:
        _restore(incluster, harness_docs, old_version, old_policy)


def _restore(
    incluster: InClusterDeployment,  # noqa: F811
    docs: list[dict[str, Any]],
    version: str,
    policy: str,
) -> None:
    """The session's Sandman back as it was (whatever of the test's is left goes first)."""
    ap.uninstall(incluster.kubectl, docs, progress=lambda _m: None)
    incluster.apply_version(version)
    incluster.wait_available()
    if incluster.policy.read() != policy:
        incluster.policy.write(policy)
