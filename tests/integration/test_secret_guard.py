"""The webhook's Secret writes are limited in the apiserver (issue 15 item 11).

The manifests' RBAC lets the webhook's ServiceAccount create Secrets anywhere
(RBAC cannot limit a create by name); manifests/webhook/secret-guard.yaml, a
ValidatingAdmissionPolicy, must refuse everything but Opaque `sandman-access`
outside system namespaces and its own Secrets in sandman-system. Requests are
made as that account (impersonation), as server-side dry runs.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from sandman.contract import NAMESPACE
from sandman.harness.cluster.deploy import MANIFESTS
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.testing import wait_for

WEBHOOK_SA = "system:serviceaccount:sandman-system:sandman-webhook"
FILES = ("serviceaccount.yaml", "rbac.yaml", "secret-guard.yaml")


def _kubectl(
    cluster: LocalCluster, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cluster.binaries.kubectl), f"--kubeconfig={cluster.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _docs() -> list[dict[str, Any]]:
    out = []
    for f in FILES:
        for d in yaml.safe_load_all((MANIFESTS / "webhook" / f).read_text()):
            if d:
                if d["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
                    d["metadata"]["namespace"] = NAMESPACE
                out.append(d)
    return out


@pytest.fixture(scope="module")
def guarded(cluster: LocalCluster) -> Iterator[None]:
    """The manifests' webhook RBAC and guard, applied (and removed if we added them)."""
    added = []
    for d in _docs():
        ref = [d["kind"], d["metadata"]["name"]]
        if "namespace" in d["metadata"]:
            ref += ["-n", d["metadata"]["namespace"]]
        if _kubectl(cluster, "get", *ref).returncode != 0:
            added.append(ref)
    proc = _kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump_all(_docs()))
    assert proc.returncode == 0, proc.stderr
    yield
    for ref in reversed(added):
        _kubectl(cluster, "delete", "--ignore-not-found", *ref)


def _create_as_webhook(
    cluster: LocalCluster, ns: str, name: str, type_: str = "Opaque", *, as_webhook: bool = True
) -> subprocess.CompletedProcess[str]:
    secret: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": ns},
        "type": type_,
        "data": {"key": "a2V5"},
    }
    if type_ == "kubernetes.io/service-account-token":
        secret["metadata"]["annotations"] = {"kubernetes.io/service-account.name": "default"}
        secret.pop("data")
    who = [f"--as={WEBHOOK_SA}"] if as_webhook else []
    return _kubectl(
        cluster, "create", "--dry-run=server", *who, "-f", "-", stdin=json.dumps(secret)
    )


def test_the_webhook_may_write_only_its_own_secrets(
    cluster: LocalCluster, namespace: str, guarded: None
) -> None:
    # The policy becomes active asynchronously: wait until it refuses.
    wait_for(
        lambda: (
            "sandman webhook may write only"
            in _create_as_webhook(cluster, "kube-system", "sandman-access").stderr
        ),
        timeout=60,
        what="the ValidatingAdmissionPolicy active",
    )
    allowed = [
        (namespace, "sandman-access", "Opaque"),
        (NAMESPACE, "sandman-cluster-key", "Opaque"),
        (NAMESPACE, "sandman-admission-key", "Opaque"),
    ]
    refused = [
        ("kube-system", "sandman-access", "Opaque"),  # a system namespace
        ("kube-public", "sandman-access", "Opaque"),
        (namespace, "sandman-access", "kubernetes.io/service-account-token"),  # a token Secret
        ("kube-system", "admin-token", "kubernetes.io/service-account-token"),
        (namespace, "someone-elses", "Opaque"),  # another name
        (NAMESPACE, "sandman-access", "Opaque"),
        (NAMESPACE, "anything", "Opaque"),
    ]
    for ns, name, type_ in allowed:
        p = _create_as_webhook(cluster, ns, name, type_)
        # AlreadyExists comes from storage, after every admission check passed.
        assert p.returncode == 0 or "AlreadyExists" in p.stderr, (ns, name, type_, p.stderr)
    for ns, name, type_ in refused:
        p = _create_as_webhook(cluster, ns, name, type_)
        assert p.returncode != 0 and "sandman webhook may write only" in p.stderr, (
            ns,
            name,
            type_,
            p.stdout,
        )
    # RBAC alone would have let it (the guard is what refuses), and nobody else is limited.
    assert _create_as_webhook(cluster, namespace, "someone-elses", as_webhook=False).returncode == 0
