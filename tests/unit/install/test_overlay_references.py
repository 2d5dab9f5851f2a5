"""Every Secret and ConfigMap a rendered object reads exists: made by the render
itself, by a component at run time (the webhook's own TLS Secret, cert-manager's
Certificate), or documented as the admin's to create.

Rendered by the harness's kubectl (kustomize) in the combinations an admin
installs, monitoring and cert-manager together included.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandman.install import apply as ap
from sandman.install import render

KUBECTL = Path.home() / ".cache/sandman/kube/v1.34.4/bin/kubectl"
pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="the harness's kubectl is not built")
DOCS = Path(__file__).resolve().parents[3] / "docs"

Ref = tuple[str, str, str]  # kind, namespace, name
# What the webhook writes itself when it manages its own TLS (webhook/cert_plan.py).
WEBHOOK_TLS = ("Secret", "sandman-system", "sandman-webhook-tls")
WEBHOOK_TLS_KEYS = {"ca.crt", "ca.key", "tls.crt", "tls.key", "ca-bundle.crt"}
# What cert-manager writes into a Certificate's Secret.
CERT_MANAGER_KEYS = {"tls.crt", "tls.key", "ca.crt"}
# The admin's (or the harness's) to create, and where the docs say so.
PRE_EXISTING = {
    ("ConfigMap", "sandman-system", "sandman-apiserver-client-ca"): DOCS / "install.md",
}


def kustomize(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run([str(KUBECTL), "kustomize", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _pod_refs(ns: str, spec: dict[str, Any]) -> Iterator[tuple[Ref, str | None]]:
    for v in spec.get("volumes") or []:
        sources = [v, *((v.get("projected") or {}).get("sources") or [])]
        for s in sources:
            if "secret" in s and not s["secret"].get("optional"):
                name = s["secret"].get("secretName") or s["secret"].get("name")
                for item in s["secret"].get("items") or [{"key": None}]:
                    yield ("Secret", ns, name), item["key"]
            if "configMap" in s and not s["configMap"].get("optional"):
                for item in s["configMap"].get("items") or [{"key": None}]:
                    yield ("ConfigMap", ns, s["configMap"]["name"]), item["key"]
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for e in c.get("env") or []:
            src = e.get("valueFrom") or {}
            for field, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
                if field in src and not src[field].get("optional"):
                    yield (kind, ns, src[field]["name"]), src[field]["key"]
        for e in c.get("envFrom") or []:
            for field, kind in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
                if field in e and not e[field].get("optional"):
                    yield (kind, ns, e[field]["name"]), None
        for a in [*(c.get("command") or []), *(c.get("args") or [])]:
            if a.startswith("--policy-configmap="):
                cm_ns, _, name = a.split("=", 1)[1].rpartition("/")
                yield ("ConfigMap", cm_ns or ns, name), None


def _monitor_refs(ns: str, spec: dict[str, Any]) -> Iterator[tuple[Ref, str | None]]:
    for ep in [*(spec.get("endpoints") or []), *(spec.get("podMetricsEndpoints") or [])]:
        tls = ep.get("tlsConfig") or {}
        for part in ("ca", "cert"):
            for field, kind in (("secret", "Secret"), ("configMap", "ConfigMap")):
                if field in (tls.get(part) or {}):
                    yield (kind, ns, tls[part][field]["name"]), tls[part][field]["key"]
        if "keySecret" in tls:
            yield ("Secret", ns, tls["keySecret"]["name"]), tls["keySecret"]["key"]
        if "bearerTokenSecret" in ep:
            yield ("Secret", ns, ep["bearerTokenSecret"]["name"]), ep["bearerTokenSecret"]["key"]


def references(docs: list[dict[str, Any]]) -> list[tuple[str, Ref, str | None]]:
    """(who, (kind, namespace, name), key or None) of every read in ``docs``."""
    out = []
    for d in docs:
        ns = d["metadata"].get("namespace", "default")
        who = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            refs = _pod_refs(ns, d["spec"]["template"]["spec"])
        elif d["kind"] in ("ServiceMonitor", "PodMonitor"):
            refs = _monitor_refs(ns, d["spec"])
        else:
            continue
        out += [(who, ref, key) for ref, key in refs]
    return out


def provided(docs: list[dict[str, Any]]) -> dict[Ref, set[str] | None]:
    """What exists once the render is applied and running: ref -> its keys
    (None: any key, for a pre-existing object whose keys are the admin's)."""
    out: dict[Ref, set[str] | None] = {}
    for d in docs:
        ns = d["metadata"].get("namespace", "default")
        if d["kind"] in ("Secret", "ConfigMap"):
            keys = {
                *(d.get("data") or {}),
                *(d.get("stringData") or {}),
                *(d.get("binaryData") or {}),
            }
            out[(d["kind"], ns, d["metadata"]["name"])] = keys
        if d["kind"] == "Certificate":
            out[("Secret", ns, d["spec"]["secretName"])] = CERT_MANAGER_KEYS
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "sandman-webhook":
            args = d["spec"]["template"]["spec"]["containers"][0].get("args") or []
            if not any(a.startswith("--tls-cert-file=") for a in args):
                out[WEBHOOK_TLS] = WEBHOOK_TLS_KEYS
    for ref in PRE_EXISTING:
        out.setdefault(ref, None)
    return out


def missing(docs: list[dict[str, Any]]) -> list[str]:
    have = provided(docs)
    bad = []
    for who, ref, key in references(docs):
        if ref not in have:
            bad.append(f"{who} reads {ref[0]} {ref[1]}/{ref[2]}, which nothing creates")
        elif key is not None and have[ref] is not None and key not in have[ref]:  # type: ignore[operator]
            bad.append(
                f"{who} reads key {key} of {ref[0]} {ref[1]}/{ref[2]}, which has {have[ref]}"
            )
    return bad


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the manifests (kustomize loads a component only from below the
    kustomization that names it)."""
    dest = tmp_path_factory.mktemp("m") / "manifests"
    shutil.copytree(ap.manifests_dir(), dest, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return dest


def combined(manifests: Path, resources: list[str], components: list[str]) -> Path:
    """An admin's own overlay, next to the manifests (kustomize allows no
    component from outside an overlay's directory tree)."""
    ov = manifests / "overlays" / f"test-{'-'.join(resources + components).replace('/', '_')}"
    ov.mkdir(parents=True, exist_ok=True)
    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [f"../../{r}" for r in resources],
        "components": [f"../../components/{c}" for c in components],
    }
    (ov / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return ov


@pytest.mark.parametrize(
    ("resources", "components"),
    [
        (["default"], []),
        (["default", "monitoring"], []),
        (["default"], ["cert-manager"]),
        (["default", "monitoring"], ["cert-manager"]),
        (["default", "monitoring"], ["cert-manager", "node-delivery"]),
        (["overlays/local"], []),
    ],
)
def test_every_secret_and_configmap_read_exists(
    manifests: Path, resources: list[str], components: list[str]
) -> None:
    docs = kustomize(combined(manifests, resources, components))
    assert references(docs), "the check reads nothing: its walk is broken"
    assert missing(docs) == []


def test_with_cert_manager_prometheus_trusts_the_certificate_cert_manager_issued(
    manifests: Path,
) -> None:
    docs = kustomize(combined(manifests, ["default", "monitoring"], ["cert-manager"]))
    (mon,) = [
        d
        for d in docs
        if d["kind"] == "ServiceMonitor" and d["metadata"]["name"] == "sandman-webhook"
    ]
    tls = mon["spec"]["endpoints"][0]["tlsConfig"]
    assert tls["ca"] == {"secret": {"name": "sandman-webhook-cert", "key": "ca.crt"}}
    (cert,) = [d for d in docs if d["kind"] == "Certificate"]
    assert tls["serverName"] in cert["spec"]["dnsNames"]


def test_sandman_install_cert_manager_monitoring_renders_them_together(tmp_path: Path) -> None:
    opts = render.InstallOptions(version="9.9.9", cert_manager=True, monitoring=True)
    docs = kustomize(ap.write_overlay(tmp_path / "ov", opts))
    kinds = {d["kind"] for d in docs}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Certificate"} <= kinds
    assert missing(docs) == []


def test_pre_existing_objects_are_documented() -> None:
    for (kind, ns, name), doc in PRE_EXISTING.items():
        assert name in doc.read_text(), f"{kind} {ns}/{name} is not in {doc}"


def test_the_check_catches_a_secret_nothing_creates() -> None:
    """The ServiceMonitor as it read before cert-manager and monitoring were
    made to work together: the webhook's own Secret, with cert-manager's TLS."""
    hook = {
        "kind": "Deployment",
        "metadata": {"name": "sandman-webhook", "namespace": "sandman-system"},
        "spec": {"template": {"spec": {"containers": [{"args": ["--tls-cert-file=/t/tls.crt"]}]}}},
    }
    mon = {
        "kind": "ServiceMonitor",
        "metadata": {"name": "sandman-webhook", "namespace": "sandman-system"},
        "spec": {
            "endpoints": [
                {
                    "tlsConfig": {
                        "ca": {"secret": {"name": "sandman-webhook-tls", "key": "ca-bundle.crt"}}
                    }
                }
            ]
        },
    }
    assert missing([hook, mon]) == [
        "ServiceMonitor/sandman-webhook reads Secret sandman-system/sandman-webhook-tls, "
        "which nothing creates"
    ]
