from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from sandman import tls
from sandman.harness.cluster import components as comp
from sandman.harness.cluster.binaries import Binaries, _kube_ldflags, _output_name, binary_sets
from sandman.harness.cluster.config import (
    KWOK_POD_CIDR,
    SERVICE_CIDR,
    ClusterConfig,
    ExtenderSpec,
    Ports,
    Versions,
)
from sandman.harness.cluster.kwok_nodes import is_ready, kwok_node


def test_config_round_trips_through_json(tmp_path: Path) -> None:
    cfg = dataclasses.replace(
        ClusterConfig(state_dir=tmp_path, cache_dir=tmp_path / "c"),
        kwok_nodes=7,
        ports=Ports.free(),
        sandman_scheduler=True,
        extenders=(ExtenderSpec(url_prefix="https://127.0.0.1:1234"),),
    )
    cfg.save()
    assert ClusterConfig.load(tmp_path) == cfg


def test_free_ports_are_distinct() -> None:
    ports = [p for _, p in Ports.free().items()]
    assert len(set(ports)) == len(ports)


def test_cidrs_do_not_overlap_host_network() -> None:
    host = ipaddress.ip_network("192.0.2.0/24")
    svc, pods = ipaddress.ip_network(SERVICE_CIDR), ipaddress.ip_network(KWOK_POD_CIDR)
    assert not svc.overlaps(host) and not pods.overlaps(host) and not svc.overlaps(pods)
    assert comp.service_ip() == "10.96.0.1"


def test_kube_ldflags_carry_the_version() -> None:
    flags = _kube_ldflags("v1.34.4")
    assert "-X k8s.io/component-base/version.gitVersion=v1.34.4" in flags
    assert "-X k8s.io/client-go/pkg/version.gitMinor=34" in flags


def test_go_output_names() -> None:
    # `go build -o dir/` drops a major-version suffix from the binary name.
    assert _output_name("go.etcd.io/etcd/server/v3") == "server"
    assert _output_name("k8s.io/kubernetes/cmd/kubelet") == "kubelet"
    names = {name for bs in binary_sets(Versions()) for _, name in bs.outputs}
    assert {"etcd", "kwok", "kube-apiserver", "kubelet", "kubectl"} <= names


def test_scheduler_config_with_extender() -> None:
    ext = ExtenderSpec(url_prefix="https://127.0.0.1:9000", weight=5, http_timeout="50ms")
    doc = comp.scheduler_config("sandman-scheduler", Path("/k"), (ext,))
    assert doc["profiles"] == [{"schedulerName": "sandman-scheduler"}]
    (e,) = doc["extenders"]  # type: ignore[misc]
    assert e["nodeCacheCapable"] is True and e["ignorable"] is True
    assert e["enableHTTPS"] is True and e["httpTimeout"] == "50ms" and e["weight"] == 5
    assert "extenders" not in comp.scheduler_config("default-scheduler", Path("/k"))


def test_apiserver_argv_points_at_etcd_and_pki(tmp_path: Path) -> None:
    cfg = ClusterConfig(state_dir=tmp_path, cache_dir=tmp_path)
    bins = Binaries.in_cache(tmp_path, cfg.versions)
    argv = comp.apiserver_argv(cfg, bins, comp.Layout(tmp_path))
    assert f"--etcd-servers=http://127.0.0.1:{cfg.ports.etcd_client}" in argv
    assert "--bind-address=127.0.0.1" in argv
    assert f"--client-ca-file={tmp_path / 'pki' / 'ca.crt'}" in argv


def test_kwok_node_keeps_capacity_and_images() -> None:
    node = kwok_node("n", ClusterConfig().kwok_node, images=[{"names": ["x"], "sizeBytes": 1}])
    assert node["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    assert node["status"]["capacity"]["pods"] == "110"
    assert node["status"]["images"] == [{"names": ["x"], "sizeBytes": 1}]
    assert not is_ready(node)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    assert is_ready(node)


def test_issued_certificate_chains_to_ca_with_sans() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    ca = tls.new_ca("ca", now=now, valid_for=dt.timedelta(days=1))
    kp = tls.issue(
        ca,
        "srv",
        now=now,
        valid_for=dt.timedelta(hours=1),
        dns=["a.b"],
        ips=["127.0.0.1"],
        server=True,
    )
    cert = kp.cert
    cert.verify_directly_issued_by(ca.cert)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["a.b"]
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.not_valid_after_utc == now + dt.timedelta(hours=1)
