"""The manifests are valid Kubernetes objects: a server-side dry run of the kustomization.

The rendered objects are created (dry run: validated and admitted, never
stored) under test-unique names, so the check neither collides with nor
depends on what the local cluster already runs.
"""

from __future__ import annotations

import subprocess
import uuid

import yaml

from sandman.harness.cluster.deploy import MANIFESTS
from sandman.harness.cluster.local import LocalCluster

CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def test_kustomization_passes_a_server_side_dry_run(cluster: LocalCluster, namespace: str) -> None:
    kubectl = [str(cluster.binaries.kubectl), f"--kubeconfig={cluster.kubeconfig}"]
    rendered = subprocess.run(
        [*kubectl, "kustomize", str(MANIFESTS)], capture_output=True, text=True, check=True
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    suffix = uuid.uuid4().hex[:6]
    kinds = set()
    for d in docs:
        kinds.add(f"{d['kind']}/{d['metadata']['name']}")
        if d["kind"] in CLUSTER_SCOPED:
            d["metadata"]["name"] += f"-dryrun-{suffix}"
        else:
            d["metadata"]["namespace"] = namespace
    proc = subprocess.run(
        [*kubectl, "create", "--dry-run=server", "-o", "name", "-f", "-"],
        input=yaml.safe_dump_all(docs),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.split()) == len(docs)
    expected = {
        "Namespace/sandman-system",
        "ServiceAccount/sandman-webhook",
        "Deployment/sandman-webhook",
        "Service/sandman-webhook",
        "PodDisruptionBudget/sandman-webhook",
        "ConfigMap/sandman-policy",
        "MutatingWebhookConfiguration/sandman",
        "ValidatingWebhookConfiguration/sandman",
        "ClusterRole/sandman-webhook",
        "Deployment/sandman-reaper",
        "ClusterRole/sandman-reaper",
        "Role/sandman-reaper",
        "Deployment/sandman-scheduler",
        "ConfigMap/sandman-scheduler",
        "ClusterRole/sandman-extender",
        "Service/sandman-extender",
        "ClusterRoleBinding/sandman-scheduler-as-kube-scheduler",
        "ClusterRole/sandman-user",
    }
    assert expected <= kinds, expected - kinds
