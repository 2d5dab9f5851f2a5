"""What each `sandman install --delivery` renders, and where Sandman's pods may run.

Rendered by the harness's kubectl (kustomize), as `sandman install` does.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandman.harness.images.platforms import ARCHES
from sandman.install import apply as ap
from sandman.install import render
from sandman.install.images import Registry

KUBECTL = Path.home() / ".cache/sandman/kube/v1.34.4/bin/kubectl"
pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="the harness's kubectl is not built")


def kustomize(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run([str(KUBECTL), "kustomize", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def install_render(tmp_path: Path, **kw: Any) -> list[dict[str, Any]]:
    opts = render.InstallOptions(version="9.9.9", registry=Registry.parse("reg.example/t"), **kw)
    return kustomize(ap.write_overlay(tmp_path / "ov", opts))


def names(docs: list[dict[str, Any]]) -> set[str]:
    return {f"{d['kind']}/{d['metadata']['name']}" for d in docs}


def webhook_args(docs: list[dict[str, Any]]) -> list[str]:
    (hook,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "sandman-webhook"
    ]
    return list(hook["spec"]["template"]["spec"]["containers"][0]["args"])


def host_paths(docs: list[dict[str, Any]]) -> list[str]:
    return [
        f"{d['kind']}/{d['metadata']['name']}"
        for d in docs
        if d["kind"] in ap.ROLLED_OUT
        for v in d["spec"]["template"]["spec"].get("volumes") or []
        if "hostPath" in v
    ]


def test_copy_delivery_installs_no_node_pod_and_no_hostpath(tmp_path: Path) -> None:
    docs = install_render(tmp_path)  # the default
    assert not [d for d in docs if d["kind"] == "DaemonSet"]
    assert "Namespace/sandman-node" not in names(docs)
    assert not host_paths(docs)
    assert not any(
        (d["metadata"].get("labels") or {}).get("pod-security.kubernetes.io/enforce")
        == "privileged"
        for d in docs
        if d["kind"] == "Namespace"
    )
    assert not [a for a in webhook_args(docs) if a.startswith("--daemon-delivery")]
    # The bare manifests (`kubectl apply -k manifests/`) are the copy delivery too.
    assert names(kustomize(ap.manifests_dir())) == names(docs)


def test_shared_delivery_sets_the_webhook_default_and_runs_nothing_per_node(tmp_path: Path) -> None:
    docs = install_render(tmp_path, delivery="shared")
    assert not [d for d in docs if d["kind"] == "DaemonSet"]
    assert "--daemon-delivery=shared" in webhook_args(docs)
    assert "--node-installer" not in webhook_args(docs)  # rules asking for node get shared
    assert names(docs) == names(install_render(tmp_path / "copy"))


def test_node_delivery_adds_the_installer_with_the_injected_daemon_image(tmp_path: Path) -> None:
    docs = install_render(tmp_path, delivery="node")
    extra = names(docs) - names(install_render(tmp_path / "copy"))
    assert extra == {"Namespace/sandman-node", "DaemonSet/sandman-node"}
    assert "--daemon-delivery=node" in webhook_args(docs)
    assert "--node-installer" in webhook_args(docs)
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    init = ds["spec"]["template"]["spec"]["initContainers"][0]
    # The tree the installer names is the one the webhook injects.
    assert init["image"] == ap.daemon_image(docs) == "reg.example/t/sandman-daemon:9.9.9"
    assert init["env"] == [{"name": "SANDMAN_DAEMON_IMAGE", "value": ap.daemon_image(docs)}]


def test_every_delivery_is_a_choice_of_the_cli_and_the_webhook() -> None:
    from sandman.webhook.mutate import DELIVERIES

    assert set(render.DELIVERY_COMPONENTS) == set(DELIVERIES)
    with pytest.raises(render.RenderError):
        render.kustomization(render.InstallOptions(version="1", delivery="daemonset"), "x")


def test_scheduler_image_for_another_minor_is_named_as_given(tmp_path: Path) -> None:
    docs = install_render(tmp_path, scheduler_image="registry.k8s.io/kube-scheduler:v1.33.9")
    (sched,) = [
        d
        for d in docs
        if d["metadata"]["name"] == "sandman-scheduler" and d["kind"] == "Deployment"
    ]
    images = [c["image"] for c in sched["spec"]["template"]["spec"]["containers"]]
    assert images == [
        "registry.k8s.io/kube-scheduler:v1.33.9",
        "reg.example/t/sandman-controller:9.9.9",
    ]


def renders() -> list[tuple[str, list[dict[str, Any]]]]:
    root = ap.manifests_dir()
    out = [(o, kustomize(root / "overlays" / o)) for o in ("kind", "cert-manager", "local")]
    out.append(("manifests/", kustomize(root)))
    out.append(("node/", kustomize(root / "node")))
    return out


def placement(d: dict[str, Any]) -> dict[str, set[str]]:
    """key -> allowed values of the workload's one required node affinity term."""
    spec = d["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert len(terms) == 1, f"{d['metadata']['name']}: terms are ORed, one must hold all"
    return {
        e["key"]: set(e["values"]) for e in terms[0]["matchExpressions"] if e["operator"] == "In"
    }


def test_every_workload_runs_only_on_linux_nodes_of_the_built_architectures() -> None:
    seen = 0
    for where, docs in renders():
        for d in docs:
            if d["kind"] not in ap.ROLLED_OUT:
                continue
            seen += 1
            got = placement(d)
            assert got.get("kubernetes.io/os") == {"linux"}, (where, d["metadata"]["name"])
            # The architectures `sandman image build` makes (harness/images/platforms.py).
            assert got.get("kubernetes.io/arch") == set(ARCHES), (where, d["metadata"]["name"])
    assert seen == 3 * 4 + 2  # three Deployments per render, the local and bare installer


def test_the_local_node_installer_keeps_off_kwok_nodes_and_off_other_arches() -> None:
    (ds,) = [
        d for d in kustomize(ap.manifests_dir() / "overlays" / "local") if d["kind"] == "DaemonSet"
    ]
    terms = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    exprs = terms[0]["matchExpressions"]
    assert {"key": "type", "operator": "NotIn", "values": ["kwok"]} in exprs
    assert placement(ds)["kubernetes.io/arch"] == set(ARCHES)
    # The local webhook knows it runs, so rules may choose the node delivery.
    assert "--node-installer" in webhook_args(kustomize(ap.manifests_dir() / "overlays" / "local"))
