"""Where a guarded registry client may connect, which redirects and realms it follows."""

from __future__ import annotations

import ipaddress

import pytest

from sandman.netguard import (
    AddressRule,
    address_class,
    host_port,
    realm_refusal,
    redirect_refusal,
    url_host_port,
)

CLUSTER = (ipaddress.ip_network("10.96.0.0/12"), ipaddress.ip_network("203.0.113.0/24"))


@pytest.mark.parametrize(
    ("ip", "want"),
    [
        ("127.0.0.1", "loopback"),
        ("127.0.0.2", "loopback"),  # all of 127/8
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped: the socket reaches 127.0.0.1
        ("169.254.169.254", "link-local"),  # cloud metadata
        ("fe80::1", "link-local"),
        ("10.0.0.5", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),  # ULA
        ("100.64.0.1", "shared (CGNAT)"),
        ("100.127.255.254", "shared (CGNAT)"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
        ("10.96.0.1", "cluster network"),  # the Service network comes first
        ("203.0.113.7", "cluster network"),  # a cluster on (documentation) space
        ("240.0.0.1", "private"),  # 240/4: the stdlib counts it among the non-global ranges
        ("8.8.8.8", None),
        ("100.128.0.1", None),  # just past 100.64/10
        ("2606:4700::1", None),
    ],
)
def test_address_classes(ip: str, want: str | None) -> None:
    assert address_class(ipaddress.ip_address(ip), CLUSTER) == want


def test_listed_host_ports_go_anywhere_and_nothing_else_does() -> None:
    rule = AddressRule(listed=frozenset({("10.244.0.1", 5000), ("registry.local", 443)}))
    # the admin's endpoint: exactly that host and port
    assert rule.refusal("10.244.0.1", 5000, "10.244.0.1") is None
    assert rule.refusal("10.244.0.1", 10250, "10.244.0.1") == "private"  # the kubelet's port
    # a listed name goes where it resolves; case and a trailing dot do not matter
    assert rule.refusal("Registry.Local.", 443, "10.1.2.3") is None
    assert rule.refusal("registry.local", 80, "10.1.2.3") == "private"
    # an unlisted name that resolves to loopback (DNS rebinding) is refused
    assert rule.refusal("evil.example", 443, "127.0.0.1") == "loopback"
    assert rule.refusal("evil.example", 443, "93.184.216.34") is None
    assert rule.refusal("x", 443, "fe80::1%eth0") == "link-local"  # scoped address


def test_host_port() -> None:
    assert host_port("127.0.0.1:5000", 443) == ("127.0.0.1", 5000)
    assert host_port("Ghcr.IO", 443) == ("ghcr.io", 443)
    assert host_port("[::1]:5000", 443) == ("::1", 5000)
    assert host_port("[::1]", 80) == ("::1", 80)
    assert url_host_port("http://10.244.0.1:5000/v2/") == ("10.244.0.1", 5000)
    assert url_host_port("https://auth.docker.io/token") == ("auth.docker.io", 443)
    assert url_host_port("file:///etc/passwd") is None
    assert url_host_port("http://x:99999/") is None  # an out-of-range port


BLOB = "https://r.io/v2/app/blobs/sha256:aa"
MANIFEST = "https://r.io/v2/app/manifests/1"


@pytest.mark.parametrize(
    ("method", "first", "target", "hops", "strict", "want"),
    [
        # a blob GET to storage elsewhere: the distribution spec's one redirect
        ("GET", BLOB, "https://storage.example/obj?sig=1", 0, True, None),
        ("GET", BLOB, "https://cdn.example/obj", 2, True, None),  # the 3rd hop
        ("GET", BLOB, "https://cdn.example/obj", 3, True, "more than 3 redirects"),
        ("GET", BLOB, "http://storage.example/obj", 0, True, "redirect from HTTPS to plain HTTP"),
        ("GET", BLOB, "ftp://storage.example/obj", 0, True, "redirect to a non-HTTP URL"),
        # a manifest or a HEAD: not for a guarded client ...
        ("GET", MANIFEST, "https://other.example/m", 0, True, "redirect outside a blob download"),
        ("HEAD", MANIFEST, "https://r.io/elsewhere", 0, True, "redirect outside a blob download"),
        # ... while the CLI (no guard) follows them, within the same bounds
        ("GET", MANIFEST, "https://other.example/m", 0, False, None),
        ("GET", MANIFEST, "https://other.example/m", 3, False, "more than 3 redirects"),
    ],
)
def test_redirects(
    method: str, first: str, target: str, hops: int, strict: bool, want: str | None
) -> None:
    assert redirect_refusal(method, first, target, hops, strict=strict) == want


def test_token_realms_on_the_registrys_host_or_one_listed_for_it() -> None:
    rule = AddressRule(token_hosts={"registry-1.docker.io": ("auth.docker.io",)})
    own = [("ghcr.io", 443)]
    assert realm_refusal("https://ghcr.io/token", own, rule, "ghcr.io") is None
    other = "the token realm is on another host than the registry"
    assert realm_refusal("https://ghcr.io:8443/token", own, rule, "ghcr.io") == other
    assert realm_refusal("http://169.254.169.254/latest", own, rule, "ghcr.io") == other
    # Docker Hub's token service is on its own host, listed for that registry only
    hub = [("registry-1.docker.io", 443)]
    assert realm_refusal("https://auth.docker.io/token", hub, rule, "registry-1.docker.io") is None
    assert realm_refusal("https://auth.docker.io/token", own, rule, "ghcr.io") == other
    # a registry reached at an endpoint: the realm may name either
    mapped = [("127.0.0.1", 5000), ("10.244.0.1", 5000)]
    assert realm_refusal("http://10.244.0.1:5000/t", mapped, rule, "127.0.0.1:5000") is None
    assert realm_refusal("gopher://x/", own, rule, "ghcr.io") == (
        "the token realm is not an http(s) URL"
    )
