"""How the local apiserver authenticates itself to admission webhooks.

What an admin of a self-managed cluster configures (docs/install.md,
"Authenticating the apiserver to the webhook"): an AdmissionConfiguration
(``--admission-control-config-file``) whose MutatingAdmissionWebhook and
ValidatingAdmissionWebhook plugins read a kubeconfig; its users are named by
the host the apiserver calls (a Service's ``NAME.NAMESPACE.svc``, a wildcard
``*.NAMESPACE.svc``, or a URL's ``HOST:PORT``), each with the client
certificate to present there. Sandman's webhook then answers only callers with
a certificate from that CA (``--client-ca-file``).

Pure: file contents from the PKI's paths; ``local.py`` writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandman.contract import NAMESPACE
from sandman.harness.cluster.pki import ADMISSION_CLIENT, ADMISSION_CLIENT_CA, Pki

PLUGINS = ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")


def webhook_hosts(host_webhook_port: int) -> tuple[str, ...]:
    """Where the apiserver meets Sandman's webhook: the in-cluster Service
    (port 443, so no port in the name) and the host process's URL."""
    return (f"*.{NAMESPACE}.svc", f"127.0.0.1:{host_webhook_port}")


def kubeconfig(pki: Pki, hosts: tuple[str, ...]) -> dict[str, Any]:
    cert = {
        "client-certificate": str(pki.crt(ADMISSION_CLIENT)),
        "client-key": str(pki.key(ADMISSION_CLIENT)),
    }
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "users": [{"name": host, "user": dict(cert)} for host in hosts],
    }


def configuration(kubeconfig_path: Path) -> dict[str, Any]:
    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {
                "name": name,
                "configuration": {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "WebhookAdmissionConfiguration",
                    "kubeConfigFile": str(kubeconfig_path),
                },
            }
            for name in PLUGINS
        ],
    }


def client_ca(pki: Pki) -> Path:
    """The CA a webhook trusts for the apiserver's certificate."""
    return pki.crt(ADMISSION_CLIENT_CA)


def client_cert(pki: Pki) -> tuple[Path, Path]:
    """The apiserver's admission client certificate and key (a benchmark that
    posts reviews straight to the webhook presents them, as the apiserver does)."""
    return pki.crt(ADMISSION_CLIENT), pki.key(ADMISSION_CLIENT)
