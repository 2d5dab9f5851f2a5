"""The Kubernetes versions `sandman install` accepts (worked examples of kubeversion.check)."""

from __future__ import annotations

import pytest

from sandman.harness.cluster.config import KUBERNETES_VERSION
from sandman.install import kubeversion as kv
from sandman.install.kubeversion import KubeVersion


def test_the_release_scheduler_is_the_kubernetes_the_harness_builds_and_tests() -> None:
    v = KubeVersion.parse(KUBERNETES_VERSION)
    assert (v.major, v.minor) == kv.SCHEDULER_MINOR
    assert kv.check(v).ok and kv.check(v).tested


@pytest.mark.parametrize(
    ("doc", "want"),
    [
        ({"major": "1", "minor": "34", "gitVersion": "v1.34.4"}, (1, 34, 4)),
        ({"major": "1", "minor": "30+", "gitVersion": "v1.30.14-eks-1f3d7c2"}, (1, 30, 14)),
        ({"major": "1", "minor": "31", "gitVersion": "v1.31.2-gke.1200000"}, (1, 31, 2)),
        ({"major": "1", "minor": "33+"}, (1, 33, 0)),
    ],
)
def test_server_versions_as_providers_write_them(doc: dict, want: tuple) -> None:
    v = KubeVersion.from_server(doc)
    assert (v.major, v.minor, v.patch) == want


def test_a_version_body_without_a_version_is_an_error() -> None:
    with pytest.raises(kv.VersionError):
        KubeVersion.from_server({"platform": "linux/amd64"})


def test_same_minor_is_supported_and_tested() -> None:
    got = kv.check(KubeVersion.parse("v1.34.1"))
    assert got.ok and got.tested
    assert "supported and tested" in got.message


def test_one_minor_newer_apiserver_is_within_skew_but_warned() -> None:
    got = kv.check(KubeVersion.parse("v1.35.0"))
    assert got.ok and not got.tested
    assert got.message.startswith("warning:")
    assert "registry.k8s.io/kube-scheduler:v1.35.0" in got.message


@pytest.mark.parametrize("server", ["v1.33.9-eks-1f3d7c2", "v1.30.0", "v1.31.2-gke.1200000"])
def test_an_older_apiserver_is_refused_naming_the_range_and_a_matching_scheduler(
    server: str,
) -> None:
    v = KubeVersion.parse(server)
    got = kv.check(v)
    assert not got.ok
    assert "1.34 (tested) and 1.35" in got.message
    assert f"--scheduler-image registry.k8s.io/kube-scheduler:v1.{v.minor}.{v.patch}" in (
        got.message
    )
    assert "newer than its apiserver" in got.message


def test_two_minors_newer_is_refused() -> None:
    got = kv.check(KubeVersion.parse("v1.36.1"))
    assert not got.ok and "more than one minor newer" in got.message
    assert "registry.k8s.io/kube-scheduler:v1.36.1" in got.message


def test_below_the_manifests_floor_is_refused_whatever_the_scheduler() -> None:
    v = KubeVersion.parse("v1.29.5")
    assert not kv.check(v).ok and "1.30+" in kv.check(v).message
    assert not kv.check(v, "registry.k8s.io/kube-scheduler:v1.29.5").ok


def test_a_scheduler_image_of_the_apiserver_minor_is_accepted() -> None:
    v = KubeVersion.parse("v1.32.3")
    got = kv.check(v, "registry.k8s.io/kube-scheduler:v1.32.3")
    assert got.ok and not got.tested
    assert kv.check(v, "ghcr.io/me/sandman-scheduler:0.1.0-k8s1.32").ok
    # One minor older is within the skew policy; newer never is.
    assert kv.check(v, "registry.k8s.io/kube-scheduler:v1.31.9").ok
    assert not kv.check(v, "registry.k8s.io/kube-scheduler:v1.33.0").ok


@pytest.mark.parametrize(
    "ref",
    [
        "ghcr.io/me/kube-scheduler:latest",  # no version in the tag
        "ghcr.io/me/kube-scheduler",  # no tag
        "127.0.0.1:5000/kube-scheduler",  # the port is not a tag
        "registry.k8s.io/kube-scheduler@sha256:" + "0" * 64,
    ],
)
def test_a_scheduler_image_whose_tag_names_no_version_is_refused(ref: str) -> None:
    with pytest.raises(kv.VersionError):
        kv.image_minor(ref)


def test_split_image_keeps_the_registry_port() -> None:
    assert kv.split_image("127.0.0.1:5000/s/kube-scheduler:v1.34.4") == (
        "127.0.0.1:5000/s/kube-scheduler",
        "v1.34.4",
    )
