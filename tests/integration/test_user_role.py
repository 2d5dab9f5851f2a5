"""What the sandman-user role lets `sandman eval run` do, against the real apiserver.

The runner lists a namespace's NetworkPolicies before any offline task (an
eval task must not have network), so a user with only sandman-user must be
able to read them; creating them stays an admin's: the run is refused with the
command that adds them, and passes once an admin applied
`manifests/sandbox-namespace`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.client import CoreV1Api

from sandman.eval.network import NetworkNotIsolated, ensure_offline
from sandman.harness.cluster.deploy import MANIFESTS
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.testing import kubectl
from sandman.kube_async import KubeClient
from tests.kube_users import make_user


async def test_a_sandman_user_passes_the_eval_runs_offline_check(
    cluster: LocalCluster, core: CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    user = make_user(cluster, core, namespace, tmp_path / "kube")
    async with KubeClient.from_kubeconfig(user.kubeconfig) as kube:
        # Listing is granted (else: "cannot list NetworkPolicies"), creating is not.
        with pytest.raises(NetworkNotIsolated, match=r"could not be created \(HTTP 403\)"):
            await ensure_offline(kube, namespace)
        kubectl(cluster, "apply", "-n", namespace, "-k", str(MANIFESTS / "sandbox-namespace"))
        got = await ensure_offline(kube, namespace)
    assert got["created"] == []
    assert got["isolating"] == ["sandman-eval-offline-egress"]
