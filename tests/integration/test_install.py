"""`sandman install` / `sandman uninstall` against a real apiserver (a private cluster).

The session's cluster already runs Sandman under the same names, so this
test brings up its own control plane (kwok nodes only, no Sandman): install
applies the rendered overlay with kubectl, sandbox creates then depend on
the webhook (failurePolicy Fail, no pod serves it here); uninstall removes
the webhook configurations before anything else, after which sandbox
creates work again and nothing of Sandman is left.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client import AdmissionregistrationV1Api, AppsV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.contract import LABEL_SANDBOX, NAMESPACE
from sandman.harness.cluster.config import ClusterConfig, Ports
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import api_client
from sandman.harness.testing import cluster_unavailable_reason


@pytest.fixture(scope="module")
def bare() -> Iterator[LocalCluster]:
    why = cluster_unavailable_reason()
    if why:
        pytest.skip(why)
    state = Path(tempfile.mkdtemp(prefix="sandman-install-test-"))
    cluster = LocalCluster(
        dataclasses.replace(ClusterConfig(state_dir=state), ports=Ports.free(), kwok_nodes=1),
        progress=lambda _m: None,
    )
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down(purge=True)


# The admin chooses the registries sandboxes pull from (the release's policy
# admits only the local harness's registry).
INSTALL = ("install", "--registry=127.0.0.1:5000/team", "--allow-registry=ghcr.io/acme/*")


def sandman(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandman.cli.main", *args,
         f"--kubectl={cluster.binaries.kubectl}", f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip


def sandbox(core: CoreV1Api, dry_run: bool = True) -> None:
    body = {
        "metadata": {"generateName": "s-", "labels": {LABEL_SANDBOX: "true"}},
        "spec": on_kwok({"containers": [{"name": "c", "image": KWOK_IMAGE, "command": ["true"]}]}),
    }
    core.create_namespaced_pod("default", body, dry_run="All" if dry_run else None)


def test_install_then_uninstall_webhooks_first(bare: LocalCluster, tmp_path: Path) -> None:
    core = CoreV1Api(api_client(bare.kubeconfig))
    adm = AdmissionregistrationV1Api(api_client(bare.kubeconfig))
    overlay = tmp_path / "ov"
    dry = sandman(bare, *INSTALL, "--dry-run=client",
                  "-o", "yaml")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "image: 127.0.0.1:5000/team/sandman-controller:0.1.0" in dry.stdout
    with pytest.raises(ApiException):  # nothing was applied by the dry run
        core.read_namespace(NAMESPACE)

    got = sandman(bare, *INSTALL, f"--overlay-dir={overlay}",
                  "--no-wait")  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert (overlay / "manifests" / "default" / "kustomization.yaml").exists()
    # It says, and installs, the policy it was given.
    assert "rule set 'default' (enforce) for every namespace: registries ghcr.io/acme/*" in (
        got.stderr
    )
    policy = core.read_namespaced_config_map("sandman-policy", NAMESPACE).data["policy.yaml"]
    assert "allowedRegistries: [ghcr.io/acme/*]" in policy, policy
    dep = AppsV1Api(api_client(bare.kubeconfig)).read_namespaced_deployment(
        "sandman-webhook", NAMESPACE
    )
    assert dep.spec.template.spec.containers[0].image == (
        "127.0.0.1:5000/team/sandman-controller:0.1.0"
    )
    # No webhook pod can run here (kwok nodes are tainted): sandboxes now fail closed...
    with pytest.raises(ApiException) as e:
        sandbox(core)
    assert "failed calling webhook" in (e.value.body or ""), e.value.body
    # ... and a plain pod does not care.
    core.create_namespaced_pod(
        "default",
        {"metadata": {"generateName": "plain-"},
         "spec": on_kwok({"containers": [{"name": "c", "image": KWOK_IMAGE}]})},
        dry_run="All",
    )  # fmt: skip

    # An admin edits the policy live; a re-install refuses to undo it silently.
    edited = "apiVersion: sandman.dev/v1alpha1\nkind: SandboxPolicy\nrules: []\n"
    core.patch_namespaced_config_map("sandman-policy", NAMESPACE, {"data": {"policy.yaml": edited}})
    again = sandman(bare, *INSTALL, f"--overlay-dir={overlay}",
                    "--no-wait")  # fmt: skip
    assert again.returncode == 1 and "--force-conflicts" in again.stderr, again.stderr
    assert (
        core.read_namespaced_config_map("sandman-policy", NAMESPACE).data["policy.yaml"] == edited
    )
    forced = sandman(bare, *INSTALL, f"--overlay-dir={overlay}",
                     "--no-wait", "--force-conflicts")  # fmt: skip
    assert forced.returncode == 0, forced.stderr
    assert (
        core.read_namespaced_config_map("sandman-policy", NAMESPACE).data["policy.yaml"] != edited
    )

    # Uninstall, watching the order in which things go.
    seen: dict[str, float] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            now = time.monotonic()
            if "webhooks" not in seen:
                names = [m.metadata.name for m in adm.list_mutating_webhook_configuration().items]
                if "sandman" not in names:
                    seen["webhooks"] = now
            if "namespace" not in seen:
                try:
                    ns = core.read_namespace(NAMESPACE)
                    if ns.metadata.deletion_timestamp:
                        seen["namespace"] = now
                except ApiException:
                    seen["namespace"] = now
            time.sleep(0.02)

    t = threading.Thread(target=watch)
    t.start()
    try:
        gone = sandman(bare, "uninstall", f"--overlay-dir={overlay}")
    finally:
        stop.set()
        t.join()
    assert gone.returncode == 0, gone.stderr
    assert "webhook configurations removed" in gone.stderr
    assert seen["webhooks"] <= seen["namespace"], seen
    sandbox(core)  # creates work again
    assert not [m for m in adm.list_validating_webhook_configuration().items
                if m.metadata.name == "sandman"]  # fmt: skip
    with pytest.raises(ApiException):
        core.read_namespace(NAMESPACE)
