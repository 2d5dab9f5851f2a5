"""The local apiserver's admission configuration (harness/cluster/admission.py):
the shapes the apiserver reads, and the names it looks the webhook up by."""

from __future__ import annotations

from pathlib import Path

from sandman.harness.cluster import admission
from sandman.harness.cluster import components as comp
from sandman.harness.cluster.binaries import Binaries
from sandman.harness.cluster.config import ClusterConfig
from sandman.harness.cluster.pki import ADMISSION_CLIENT, ADMISSION_CLIENT_CA, Pki


def test_configuration_names_both_webhook_plugins_and_the_kubeconfig() -> None:
    doc = admission.configuration(Path("/s/config/admission-webhooks.kubeconfig"))
    assert doc["apiVersion"] == "apiserver.config.k8s.io/v1"
    assert doc["kind"] == "AdmissionConfiguration"
    assert [p["name"] for p in doc["plugins"]] == [
        "MutatingAdmissionWebhook",
        "ValidatingAdmissionWebhook",
    ]
    for p in doc["plugins"]:
        assert p["configuration"] == {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": "/s/config/admission-webhooks.kubeconfig",
        }


def test_kubeconfig_users_are_the_hosts_the_apiserver_calls() -> None:
    pki = Pki(Path("/s/pki"))
    # The Service on port 443 is looked up without a port; a URL with its port.
    hosts = admission.webhook_hosts(9443)
    assert hosts == ("*.sandman-system.svc", "127.0.0.1:9443")
    doc = admission.kubeconfig(pki, hosts)
    assert [u["name"] for u in doc["users"]] == list(hosts)
    for u in doc["users"]:
        assert u["user"] == {
            "client-certificate": f"/s/pki/{ADMISSION_CLIENT}.crt",
            "client-key": f"/s/pki/{ADMISSION_CLIENT}.key",
        }
    # The webhook trusts a CA of its own, not the cluster CA that signs users' certs.
    assert admission.client_ca(pki) == Path(f"/s/pki/{ADMISSION_CLIENT_CA}.crt")
    assert admission.client_ca(pki) != pki.ca


def test_the_apiserver_reads_it(tmp_path: Path) -> None:
    cfg = ClusterConfig(state_dir=tmp_path)
    lay = comp.Layout(tmp_path)
    bins = Binaries.in_cache(cfg.cache_dir, cfg.versions)
    argv = comp.apiserver_argv(cfg, bins, lay)
    assert f"--admission-control-config-file={lay.admission_config}" in argv
