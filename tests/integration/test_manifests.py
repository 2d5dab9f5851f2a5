"""The manifests are valid Kubernetes objects: server-side dry run of the whole kustomization."""

from __future__ import annotations

import subprocess

from sandman.cluster.deploy import MANIFESTS
from sandman.cluster.local import LocalCluster


def test_kustomization_applies_with_server_side_dry_run(cluster: LocalCluster) -> None:
    proc = subprocess.run(
        [
            str(cluster.binaries.kubectl),
            f"--kubeconfig={cluster.kubeconfig}",
            "apply",
            "-k",
            str(MANIFESTS),
            "--dry-run=server",
            "-o",
            "name",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    applied = set(proc.stdout.split())
    expected = {
        "namespace/sandman-system",
        "serviceaccount/sandman-webhook",
        "clusterrole.rbac.authorization.k8s.io/sandman-webhook",
        "deployment.apps/sandman-webhook",
        "service/sandman-webhook",
        "poddisruptionbudget.policy/sandman-webhook",
        "configmap/sandman-policy",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/sandman",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/sandman",
    }
    assert expected <= applied, expected - applied
