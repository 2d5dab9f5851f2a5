"""The webhook's configuration: one dataclass, from flags and environment."""

from __future__ import annotations

import argparse
import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

from sandman.contract import NAMESPACE
from sandman.serving import add_listen_flag

SERVICE = "sandman-webhook"
CONFIG_NAME = "sandman"  # name of both webhook configurations
TLS_SECRET = "sandman-webhook-tls"


@dataclass(frozen=True)
class WebhookConfig:
    host: str = "0.0.0.0"
    port: int = 8443
    kubeconfig: Path | None = None  # None: in-cluster service account
    namespace: str = NAMESPACE  # where our Secrets live
    daemon_image: str = "127.0.0.1:5000/sandman/daemon:latest"
    policy_file: Path | None = None
    policy_configmap: str | None = None  # "namespace/name", watched through the API
    # TLS: Secret-managed (default) or mounted files (e.g. cert-manager).
    tls_secret: str = TLS_SECRET
    config_name: str = CONFIG_NAME  # the webhook configurations whose caBundle we keep
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    extra_ips: tuple[str, ...] = ()  # SAN IPs: 127.0.0.1 for a host-mode webhook
    # A year for the CA and 90 days for the serving cert (the Let's Encrypt
    # cadence): rotation is exercised routinely, not once a decade.
    ca_validity: dt.timedelta = dt.timedelta(days=365)
    cert_validity: dt.timedelta = dt.timedelta(days=90)
    work_dir: Path = Path("/tmp/sandman-webhook")
    # Namespaces that never get sandboxes nor the access Secret.
    excluded_namespaces: tuple[str, ...] = (
        "kube-system",
        "kube-public",
        "kube-node-lease",
        NAMESPACE,
    )
    event_on_inject: bool = False  # one Event per sandbox doubles the writes of a burst
    # Publish each namespace's access key. Every replica may (same content);
    # off only for an extra instance that must not touch cluster-wide state.
    publish_access: bool = True

    @property
    def dns_names(self) -> tuple[str, ...]:
        return (
            SERVICE,
            f"{SERVICE}.{self.namespace}",
            f"{SERVICE}.{self.namespace}.svc",
            f"{SERVICE}.{self.namespace}.svc.cluster.local",
            "localhost",
        )


def add_flags(p: argparse.ArgumentParser) -> None:
    add_listen_flag(p, "0.0.0.0:8443", "HOST:PORT for HTTPS")
    p.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="default: in-cluster service account (or $KUBECONFIG)",
    )
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", NAMESPACE))
    p.add_argument(
        "--daemon-image",
        default=os.environ.get("SANDMAN_DAEMON_IMAGE"),
        required="SANDMAN_DAEMON_IMAGE" not in os.environ,
        help="image the init container copies sandmand from",
    )
    p.add_argument("--policy-file", type=Path, default=None)
    p.add_argument("--policy-configmap", default=None, help="NAMESPACE/NAME, watched")
    p.add_argument("--tls-cert-file", type=Path, default=None)
    p.add_argument("--tls-key-file", type=Path, default=None)
    p.add_argument("--extra-ip", action="append", default=[], help="SAN IP (repeat)")
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/sandman-webhook"))
    p.add_argument("--event-on-inject", action="store_true")
    p.add_argument("--tls-secret", default=TLS_SECRET)
    p.add_argument(
        "--config-name",
        default=CONFIG_NAME,
        help="name of the webhook configurations to keep caBundle in",
    )


def from_args(args: argparse.Namespace) -> WebhookConfig:
    host, port = args.listen
    return WebhookConfig(
        host=host,
        port=port,
        kubeconfig=args.kubeconfig,
        namespace=args.namespace,
        daemon_image=args.daemon_image,
        policy_file=args.policy_file,
        policy_configmap=args.policy_configmap,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        extra_ips=tuple(args.extra_ip),
        work_dir=args.work_dir,
        event_on_inject=args.event_on_inject,
        tls_secret=args.tls_secret,
        config_name=args.config_name,
    )
