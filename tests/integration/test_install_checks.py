"""`sandman install`'s checks against the test cluster's real apiserver.

- its Kubernetes version check passes on the harness's apiserver (the
  version every test tier runs);
- each delivery's objects, with and without cert-manager, pass a server-side
  dry run (the custom resources of cert-manager and the Prometheus Operator
  are left out where their CRDs are not installed);
- its rollout wait fails fast, naming the reason, for a pod that can never
  be placed.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandman.harness.cluster.local import LocalCluster
from sandman.install import apply as ap
from sandman.install import kubeversion, render

CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
# Groups of custom resources the overlays use; served only where their
# operators are installed.
OPERATOR_GROUPS = {"cert-manager.io", "monitoring.coreos.com"}


def kubectl(cluster: LocalCluster) -> ap.Kubectl:
    return ap.Kubectl(str(cluster.binaries.kubectl), str(cluster.kubeconfig))


def test_the_version_check_passes_on_the_harness_apiserver(cluster: LocalCluster) -> None:
    server = ap.server_version(kubectl(cluster))
    assert server.text.startswith("v1.34.")
    verdict = kubeversion.check(server)
    assert verdict.ok and verdict.tested, verdict.message


def served_groups(k: ap.Kubectl) -> set[str]:
    out = k.run("api-versions").stdout.split()
    return {v.split("/")[0] for v in out if "/" in v}


@pytest.mark.parametrize(
    "opts",
    [
        {"delivery": "copy"},
        {"delivery": "shared"},
        {"delivery": "node"},
        {"delivery": "node", "cert_manager": True},
    ],
    ids=lambda o: "-".join(f"{v if v is not True else k}" for k, v in o.items()),
)
def test_each_delivery_passes_a_server_side_dry_run(
    cluster: LocalCluster, namespace: str, tmp_path: Path, opts: dict[str, Any]
) -> None:
    k = kubectl(cluster)
    overlay = ap.write_overlay(
        tmp_path / "ov", render.InstallOptions(version="9.9.9", monitoring=True, **opts)
    )
    docs = ap.documents(ap.render_overlay(k, overlay))
    served = served_groups(k)
    suffix = uuid.uuid4().hex[:6]
    sent, left_out = [], set()
    for d in docs:
        group = d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else ""
        if group in OPERATOR_GROUPS and group not in served:
            left_out.add(group)
            continue
        if d["kind"] in CLUSTER_SCOPED:
            d["metadata"]["name"] += f"-dryrun-{suffix}"
        else:
            d["metadata"]["namespace"] = namespace
        sent.append(d)
    assert left_out <= OPERATOR_GROUPS
    proc = subprocess.run(
        [*k.argv("create", "--dry-run=server", "-o", "name", "-f", "-")],
        input=yaml.safe_dump_all(sent),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    created = proc.stdout.split()
    assert len(created) == len(sent)
    assert any("daemonset" in c for c in created) == (opts["delivery"] == "node")


def test_the_wait_fails_fast_naming_why_a_pod_cannot_be_placed(
    cluster: LocalCluster, namespace: str
) -> None:
    """A Deployment for an architecture no node has: the wait says so (the
    scheduler's message) after the grace, not at the rollout timeout."""
    name = "arch-nowhere"
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/arch": "s390x"},
                    # As the node installer: every taint tolerated, so the
                    # architecture is what keeps it off each node.
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "c", "image": "sandman-none:0"}],
                },
            },
        },
    }
    k = kubectl(cluster)
    k.run("create", "-f", "-", input=json.dumps(dep))
    said: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(ap.InstallError) as e:
        ap.wait_available(k, [dep], timeout_s=120, progress=said.append, unschedulable_grace_s=5)
    took = time.monotonic() - t0
    assert took < 60, took
    msg = str(e.value)
    assert f"pod {namespace}/{name}-" in msg and "(not scheduled): unschedulable:" in msg
    assert "didn't match Pod's node affinity/selector" in msg
    assert any(s.startswith("  waiting: pod ") for s in said), said
