"""A non-admin user for tests: a ServiceAccount bound to sandman-user in one
namespace, and a kubeconfig for it as an admin would hand one out.

The kubeconfig uses relative paths (``certificate-authority: ca.crt``,
``tokenFile: token``), resolved against its own directory as kubectl does,
and names the namespace in its context, so the CLI needs no ``-n``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes.client import CoreV1Api, RbacAuthorizationV1Api

from sandman.harness.cluster.deploy import MANIFESTS
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import api_client
from sandman.harness.testing import kubectl

ROLE_FILE = MANIFESTS / "rbac" / "sandman-user.yaml"
ROLE = "sandman-user"


@dataclass(frozen=True)
class User:
    name: str  # system:serviceaccount:NS:NAME
    namespace: str
    kubeconfig: Path


def cluster_ca(cluster: LocalCluster) -> bytes:
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    c = doc["clusters"][0]["cluster"]
    if "certificate-authority-data" in c:
        return base64.b64decode(c["certificate-authority-data"])
    return Path(c["certificate-authority"]).read_bytes()


def make_user(
    cluster: LocalCluster, core: CoreV1Api, namespace: str, where: Path, sa: str = "trainer"
) -> User:
    """ServiceAccount ``sa`` in ``namespace`` with only sandman-user there, and
    its kubeconfig in ``where`` (a TokenRequest token, valid for an hour)."""
    kubectl(cluster, "apply", "-f", str(ROLE_FILE))
    core.create_namespaced_service_account(namespace, {"metadata": {"name": sa}})
    RbacAuthorizationV1Api(api_client(cluster.kubeconfig)).create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": f"{sa}-sandman"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": ROLE,
            },
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
        },
    )
    token = core.create_namespaced_service_account_token(
        sa, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    where.mkdir(parents=True, exist_ok=True)
    (where / "ca.crt").write_bytes(cluster_ca(cluster))
    (where / "token").write_text(token)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": cluster.server, "certificate-authority": "ca.crt"}}
        ],
        "users": [{"name": sa, "user": {"tokenFile": "token"}}],
        "contexts": [{"name": sa, "context": {"cluster": "c", "user": sa, "namespace": namespace}}],
        "current-context": sa,
    }
    (where / "config").write_text(yaml.safe_dump(config))
    return User(f"system:serviceaccount:{namespace}:{sa}", namespace, where / "config")
