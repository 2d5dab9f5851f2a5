"""Where a registry client may connect, and which redirects and token realms it follows (pure).

The webhook reads image configs from registries that pod authors name, so
without a rule a pod author would choose where the webhook connects: its
own loopback, the kubelet on a node, a ClusterIP Service, the cloud's
metadata endpoint at 169.254.169.254. This module decides, for one address
at a time, whether the client may connect; ``sandman.guarded_dns`` applies
the decision to the address a connection actually goes to (after DNS), so
a name that resolves to a public address when checked and to a private one
when used gains nothing.

An address is refused when it is not a public unicast address (loopback,
link-local, RFC 1918 and ULA private, CGNAT 100.64/10, unspecified,
multicast, reserved) or lies in the cluster's pod or Service networks,
unless the admin listed that exact ``host:port`` (a registry endpoint such
as the local cluster's ``http://10.244.0.1:5000``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from sandman.oci import RegistryError, RegistryUnreachable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# RFC 6598's shared address space (carrier-grade NAT); Python's is_private
# leaves it out, and clouds use it for node and pod networks (e.g. GKE).
CGNAT = ipaddress.ip_network("100.64.0.0/10")
# RFC 6052's NAT64 prefix: a NAT64 gateway turns 64:ff9b::a9fe:a9fe into
# 169.254.169.254, so the embedded IPv4 address is what gets classified.
NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Registries answer a blob GET with a redirect to their storage (S3, GCS, a
# CDN), and a CDN may redirect once more; three hops cover every registry we
# know, more is a loop or a probe.
MAX_REDIRECTS = 3
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
DEFAULT_PORTS = {"http": 80, "https": 443}
# Token services that live on another host than their registry, by the
# registry's API host. Docker Hub's is fixed and public (the distribution
# token spec's reference deployment); any other pair an admin lists.
KNOWN_TOKEN_HOSTS: Mapping[str, tuple[str, ...]] = {
    "registry-1.docker.io": ("auth.docker.io",),
}


class RegistryTimeout(RegistryUnreachable):
    """A registry or token service did not answer in time."""


class RefusedAddress(RegistryError):
    """The client's address rule refused where a request would go (a loopback,
    private, cluster or link-local address; a redirect or token realm elsewhere).
    Definitive: asking again goes to the same place."""


def host_port(hostport: str, default_port: int) -> tuple[str, int]:
    """``"10.0.0.1:5000"`` -> ("10.0.0.1", 5000); ``"[::1]"`` -> ("::1", default_port).

    Names are compared in lowercase without a trailing dot, as DNS does."""
    text = hostport.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    return host.lower().rstrip("."), int(port) if port.isdigit() else default_port


def url_host_port(url: str) -> tuple[str, int] | None:
    """(host, port) of an http(s) URL, or None for any other URL."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.hostname.lower().rstrip("."), port or DEFAULT_PORTS[parts.scheme]


def address_class(ip: Address, cluster: Iterable[Network] = ()) -> str | None:
    """Why ``ip`` is not a public unicast address (a short fixed name), else None."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1 on a dual-stack socket
    elif isinstance(ip, ipaddress.IPv6Address) and ip in NAT64:
        ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    for net in cluster:
        if ip.version == net.version and ip in net:
            return "cluster network"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv4Address) and ip in CGNAT:
        return "shared (CGNAT)"
    if ip.is_private:
        return "private"
    if ip.is_reserved or not ip.is_global:
        return "reserved"
    return None


@dataclass(frozen=True)
class AddressRule:
    """Which addresses a guarded client may connect to.

    ``listed``: ``(host, port)`` pairs the admin named (registry endpoints,
    hosts given with ``--lookup-private-host``); connections to them go
    wherever they resolve. ``cluster``: the pod and Service networks,
    refused even where they are public address space."""

    listed: frozenset[tuple[str, int]] = frozenset()
    cluster: tuple[Network, ...] = ()
    token_hosts: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: dict(KNOWN_TOKEN_HOSTS)
    )

    def refusal(self, host: str, port: int, ip: str) -> str | None:
        """Why connecting to ``ip`` (which ``host:port`` resolved to) is refused, else None."""
        if (host.lower().rstrip("."), port) in self.listed:
            return None
        try:
            addr = ipaddress.ip_address(ip.split("%", 1)[0])
        except ValueError:
            return "not an IP address"
        return address_class(addr, self.cluster)


def redirect_refusal(
    method: str, first_url: str, target_url: str, hops: int, *, strict: bool
) -> str | None:
    """Why a redirect from a request that started at ``first_url`` to
    ``target_url`` (after ``hops`` earlier ones) is not followed, else None.

    Strict (the webhook): only a blob GET may be redirected, since the
    distribution spec sends blobs to storage elsewhere and nothing else;
    a manifest or token redirect is a registry pointing the webhook at
    another host. The target's address is checked on connect like any."""
    if hops >= MAX_REDIRECTS:
        return f"more than {MAX_REDIRECTS} redirects"
    target = urlsplit(target_url)
    if target.scheme not in DEFAULT_PORTS or url_host_port(target_url) is None:
        return "redirect to a non-HTTP URL"
    if urlsplit(first_url).scheme == "https" and target.scheme == "http":
        return "redirect from HTTPS to plain HTTP"
    if strict and not (method == "GET" and "/blobs/" in urlsplit(first_url).path):
        return "redirect outside a blob download"
    return None


def realm_refusal(
    realm: str, registry_hosts: Iterable[tuple[str, int]], rule: AddressRule, api_host: str
) -> str | None:
    """Why the token realm ``realm`` is not asked for a token, else None.

    A realm is a URL the registry chose; it must be on the registry's own
    host (as named, or the endpoint it is reached at) or on a host listed
    for that registry, so that a registry cannot make the client GET
    anything else."""
    where = url_host_port(realm)
    if where is None:
        return "the token realm is not an http(s) URL"
    if where in set(registry_hosts):
        return None
    default = DEFAULT_PORTS[urlsplit(realm).scheme]
    if any(where == host_port(h, default) for h in rule.token_hosts.get(api_host, ())):
        return None
    return "the token realm is on another host than the registry"
