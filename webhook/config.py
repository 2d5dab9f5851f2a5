"""The webhook's configuration: one dataclass, from flags and environment."""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from sandman.contract import NAMESPACE
from sandman.oci import InvalidReference, Reference
from sandman.serving import add_listen_flag
from sandman.webhook.imagecache import MAX_CONFIG_BYTES as IMAGE_CACHE_BYTES
from sandman.webhook.imageconfig import LOOKUP_BUDGET_S
from sandman.webhook.mutate import DEFAULT_SHARED_DIR, DELIVERIES
from sandman.webhook.schedulers import DEFAULT_LEASES, lease_map, parse_lease_flag

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
    # How the daemon reaches sandboxes (webhook/mutate.py DELIVERIES): a copy
    # per pod by default; policy rules may choose per namespace.
    daemon_delivery: str = "copy"
    daemon_shared_dir: str = DEFAULT_SHARED_DIR  # the node directory of "shared"
    # The node installer DaemonSet runs (--node-installer): only then can a
    # sandbox get the "node" delivery (mutate.delivery_for).
    node_installer: bool = False
    # imagePullSecrets each sandbox with an install step names for the daemon
    # image (mutate.InjectionSettings.daemon_pull_secrets).
    daemon_pull_secrets: tuple[str, ...] = ()
    policy_file: Path | None = None
    policy_configmap: str | None = None  # "namespace/name", watched through the API
    # TLS: Secret-managed (default) or mounted files (e.g. cert-manager).
    tls_secret: str = TLS_SECRET
    config_name: str = CONFIG_NAME  # the webhook configurations whose caBundle we keep
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # Only callers with a client certificate from this CA get reviews answered
    # (the apiserver's, from its AdmissionConfiguration; docs/install.md).
    client_ca_file: Path | None = None
    client_cns: tuple[str, ...] = ()  # and, if given, only these subject CNs
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
    # ENTRYPOINT/CMD of pods without `command`, read from registries
    # (webhook/imageconfig.py). Off: the daemon runs alone, with a warning.
    image_config_lookup: bool = True
    image_config_timeout_s: float = LOOKUP_BUDGET_S
    image_cache_bytes: int = IMAGE_CACHE_BYTES  # byte budget of cached configs
    read_pull_secrets: bool = False  # needs `get secrets` cluster-wide (rbac-pull-secrets.yaml)
    insecure_registries: tuple[str, ...] = ()  # plain HTTP besides loopback
    # Registry host -> the URL the webhook reaches it at (e.g. a node-local
    # registry on 127.0.0.1:5000 that a webhook pod reaches via the bridge).
    registry_endpoints: tuple[tuple[str, str], ...] = ()
    # Registry lookups connect only to public addresses (sandman/netguard.py),
    # besides endpoint targets and these HOST:PORTs; the cluster's pod and
    # Service networks are refused even where they are public space.
    lookup_allow_addresses: tuple[str, ...] = ()
    cluster_cidrs: tuple[str, ...] = ()
    # Registry -> token service host on another host (Docker Hub's is built in).
    registry_token_hosts: tuple[tuple[str, str], ...] = ()
    # Scheduler name -> (namespace, Lease) whose holder shows it runs.
    scheduler_leases: tuple[tuple[str, tuple[str, str]], ...] = tuple(DEFAULT_LEASES.items())

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
    p.add_argument(
        "--daemon-delivery",
        choices=DELIVERIES,
        default="copy",
        help="how the daemon reaches sandboxes unless a policy rule says "
        "(daemonDelivery): copy = into each pod (passes Pod Security restricted), "
        "shared = once per node, mounted read-only (a hostPath volume), "
        "node = placed on every node by the node installer (manifests/node), no install step",
    )
    p.add_argument(
        "--node-installer",
        action="store_true",
        help="the node installer DaemonSet (manifests/node) runs on the nodes; without it a "
        "sandbox whose policy rule asks for the node delivery gets the shared one, with an "
        "admission warning saying why",
    )
    p.add_argument(
        "--daemon-shared-dir",
        type=_absolute,
        default=DEFAULT_SHARED_DIR,
        help="node directory of the shared and node deliveries",
    )
    p.add_argument(
        "--daemon-pull-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="a pull Secret for the daemon image, named in the imagePullSecrets of "
        "sandboxes that pull it (copy and shared deliveries); it must exist in each "
        "sandbox namespace; repeat",
    )
    p.add_argument("--policy-file", type=Path, default=None)
    p.add_argument("--policy-configmap", default=None, help="NAMESPACE/NAME, watched")
    p.add_argument("--tls-cert-file", type=Path, default=None)
    p.add_argument("--tls-key-file", type=Path, default=None)
    p.add_argument(
        "--client-ca-file",
        type=Path,
        default=None,
        help="answer /mutate and /validate only for clients with a certificate from "
        "this CA (the apiserver's; docs/install.md)",
    )
    p.add_argument("--client-cn", action="append", default=[], help="allowed client CN (repeat)")
    p.add_argument("--extra-ip", action="append", default=[], help="SAN IP (repeat)")
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/sandman-webhook"))
    p.add_argument("--event-on-inject", action="store_true")
    p.add_argument("--tls-secret", default=TLS_SECRET)
    p.add_argument(
        "--image-config-lookup",
        choices=("on", "off"),
        default="on",
        help="read ENTRYPOINT/CMD from the registry for sandboxes without `command`",
    )
    p.add_argument(
        "--image-config-timeout",
        type=float,
        default=LOOKUP_BUDGET_S,
        help="seconds one admission may wait for a registry (of the webhook's 5 s)",
    )
    p.add_argument(
        "--image-cache-bytes",
        type=int,
        default=IMAGE_CACHE_BYTES,
        help="bytes the cached image configs may hold (estimated; least recently used "
        "evicted first)",
    )
    p.add_argument(
        "--read-pull-secrets",
        action="store_true",
        help="use the pod's imagePullSecrets for lookups (RBAC: get secrets)",
    )
    p.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        help="HOST[:PORT] spoken to over plain HTTP (loopback always is); repeat",
    )
    p.add_argument(
        "--registry-endpoint",
        action="append",
        default=[],
        type=_endpoint,
        help="HOST=URL: reach the registry images name HOST at URL (e.g. "
        "127.0.0.1:5000=http://10.244.0.1:5000); repeat",
    )
    p.add_argument(
        "--lookup-allow-address",
        action="append",
        default=[],
        type=_hostport,
        help="HOST:PORT image lookups may connect to although it is a loopback, private, "
        "link-local or cluster address (a --registry-endpoint target already is); repeat",
    )
    p.add_argument(
        "--cluster-cidr",
        action="append",
        default=[],
        type=_cidr,
        help="the cluster's pod or Service network (CIDR): image lookups never connect "
        "there unless listed; repeat",
    )
    p.add_argument(
        "--registry-token-host",
        action="append",
        default=[],
        type=_token_host,
        help="REGISTRY=HOST[:PORT]: a token service on another host than its registry "
        "(Docker Hub's auth.docker.io is built in); repeat",
    )
    p.add_argument(
        "--scheduler-lease",
        action="append",
        default=[],
        type=parse_lease_flag,
        help="SCHEDULER=NAMESPACE/LEASE whose holder shows the scheduler runs "
        "(SCHEDULER= for one without leader election: not checked); repeat",
    )
    p.add_argument(
        "--config-name",
        default=CONFIG_NAME,
        help="name of the webhook configurations to keep caBundle in",
    )


def _absolute(value: str) -> str:
    norm = os.path.normpath(value)
    if not value.startswith("/") or norm == "/" or norm != value.rstrip("/"):
        raise argparse.ArgumentTypeError(f"{value!r}: expected an absolute, normalised directory")
    return norm


def _endpoint(value: str) -> tuple[str, str]:
    host, eq, url = value.partition("=")
    if not (eq and host and url.startswith(("http://", "https://"))):
        raise argparse.ArgumentTypeError(f"{value!r}: expected HOST=http(s)://ADDRESS[:PORT]")
    return host, url


def _hostport(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise argparse.ArgumentTypeError(f"{value!r}: expected HOST:PORT")
    return value


def _cidr(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a CIDR (10.96.0.0/12)") from None


def _token_host(value: str) -> tuple[str, str]:
    registry, eq, host = value.partition("=")
    if not (eq and registry and host) or "/" in host or "/" in registry:
        raise argparse.ArgumentTypeError(f"{value!r}: expected REGISTRY=HOST[:PORT]")
    try:
        Reference.parse(f"{registry}/x")
    except InvalidReference:
        raise argparse.ArgumentTypeError(f"{value!r}: {registry!r} is no registry host") from None
    return registry, host


def from_args(args: argparse.Namespace) -> WebhookConfig:
    host, port = args.listen
    if args.daemon_delivery == "node" and not args.node_installer:
        # Every sandbox would fall back: say so at start, not in each admission.
        raise SystemExit(
            "sandman webhook: --daemon-delivery=node needs the node installer "
            "(manifests/node, `sandman install --delivery node`) and --node-installer"
        )
    return WebhookConfig(
        host=host,
        port=port,
        kubeconfig=args.kubeconfig,
        namespace=args.namespace,
        daemon_image=args.daemon_image,
        daemon_delivery=args.daemon_delivery,
        daemon_shared_dir=args.daemon_shared_dir,
        node_installer=args.node_installer,
        daemon_pull_secrets=tuple(args.daemon_pull_secret),
        policy_file=args.policy_file,
        policy_configmap=args.policy_configmap,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        client_ca_file=args.client_ca_file,
        client_cns=tuple(args.client_cn),
        extra_ips=tuple(args.extra_ip),
        work_dir=args.work_dir,
        event_on_inject=args.event_on_inject,
        tls_secret=args.tls_secret,
        config_name=args.config_name,
        image_config_lookup=args.image_config_lookup == "on",
        image_config_timeout_s=args.image_config_timeout,
        image_cache_bytes=args.image_cache_bytes,
        read_pull_secrets=args.read_pull_secrets,
        insecure_registries=tuple(args.insecure_registry),
        registry_endpoints=tuple(args.registry_endpoint),
        lookup_allow_addresses=tuple(args.lookup_allow_address),
        cluster_cidrs=tuple(args.cluster_cidr),
        registry_token_hosts=tuple(args.registry_token_host),
        scheduler_leases=lease_map(args.scheduler_lease),
    )
