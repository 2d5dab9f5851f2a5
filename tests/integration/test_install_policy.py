"""The policy `sandman install --allow-registry` writes is the one the webhook applies.

`sandman install` renders the sandman-policy ConfigMap (client dry run, as
an admin would preview it); the test puts that policy in force on the
session's cluster (the webhook watches the ConfigMap) and creates sandboxes
through the real apiserver (server-side dry runs, nothing stored): familiar
Docker Hub names are admitted by `docker.io/*` as the runtime reads them, an
unlisted registry is denied naming the rule set, the rule and the fix.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import yaml
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.contract import ANN_INJECTED, LABEL_SANDBOX
from sandman.harness.cluster.kwok_nodes import on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import raw


def sandbox(image: str) -> dict[str, Any]:
    # An explicit command: the webhook then reads no image config from Docker Hub.
    return {
        "metadata": {"generateName": "sb-", "labels": {LABEL_SANDBOX: "true"}},
        "spec": on_kwok({"containers": [{"name": "main", "image": image, "command": ["true"]}]}),
    }


def create(core: CoreV1Api, ns: str, image: str) -> dict[str, Any]:
    return raw(
        core.create_namespaced_pod(ns, sandbox(image), dry_run="All", _preload_content=False)
    )


def installed_policy(cluster: LocalCluster, *flags: str) -> tuple[str, str]:
    """(policy.yaml of the rendered sandman-policy ConfigMap, install's stderr)."""
    got = subprocess.run(
        [sys.executable, "-m", "sandman.cli.main", "install", *flags,
         "--dry-run=client", "-o", "yaml", f"--kubectl={cluster.binaries.kubectl}",
         f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    [cm] = [
        d
        for d in yaml.safe_load_all(got.stdout)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "sandman-policy"
    ]
    return cm["data"]["policy.yaml"], got.stderr


def test_allow_registry_policy_admits_docker_hub_names_and_denies_the_rest(
    cluster: LocalCluster, core: CoreV1Api, namespace: str
) -> None:
    text, said = installed_policy(cluster, "--allow-registry=docker.io/*")
    assert "rule set 'default' (enforce) for every namespace: registries docker.io/*" in said
    deployment = cluster.deployment
    assert deployment is not None
    original = deployment.policy_file.read_text()
    deployment.policy_file.write_text(text)  # waits until every webhook loaded it
    try:
        for image in (
            "python:3.11",
            "library/python:3.11",
            "docker.io/python:3.11",
            "index.docker.io/library/python:3.11",
        ):
            pod = create(core, namespace, image)
            assert ANN_INJECTED in pod["metadata"]["annotations"], image
        with pytest.raises(ApiException) as e:
            create(core, namespace, "quay.io/acme/tool:1")
        assert e.value.status in (400, 403)
        assert (
            "sandman policy 'default' (enforce): [registry] container main: image "
            "'quay.io/acme/tool:1' is not from an allowed registry; fix: use an image "
            "matching one of ['docker.io/*']"
        ) in (e.value.body or ""), e.value.body
        # a reference the runtime could not pull is denied saying why
        with pytest.raises(ApiException) as e:
            create(core, namespace, "Python:3.11")
        assert "is not a valid image reference" in (e.value.body or ""), e.value.body
    finally:
        deployment.policy_file.write_text(original)


def test_install_refuses_the_harness_only_policy_without_saying_so(
    cluster: LocalCluster,
) -> None:
    got = subprocess.run(
        [sys.executable, "-m", "sandman.cli.main", "install", "--dry-run=client",
         f"--kubectl={cluster.binaries.kubectl}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 2
    assert "--allow-registry GLOB" in got.stderr and "--policy FILE" in got.stderr
    text, _ = installed_policy(cluster, "--local-harness")
    assert 'allowedRegistries: ["127.0.0.1:5000/*"]' in text
