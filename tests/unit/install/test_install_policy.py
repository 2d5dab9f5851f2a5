"""`sandman install` makes the admin choose the registries, and installs what it says."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from sandman.cli.main import main
from sandman.install import apply as ap
from sandman.install import render
from sandman.install.policy import PolicyChoiceError, choose
from sandman.webhook.policy import parse_policy_text

KUBECTL = Path.home() / ".cache/sandman/kube/v1.34.4/bin/kubectl"
ROOT = Path(__file__).resolve().parents[3]
SHIPPED = (ROOT / "manifests/webhook/policy.yaml").read_text()


def test_no_choice_is_refused_naming_both_flags(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["install", "--registry", "ghcr.io/acme", "--dry-run=client"]) == 2
    err = capsys.readouterr().err
    assert "--allow-registry GLOB" in err and "--policy FILE" in err
    assert "127.0.0.1:5000/*" in err


def test_allow_registry_is_the_release_policy_with_those_registries() -> None:
    got = choose(["docker.io/*", "123456789012.dkr.ecr.us-east-1.amazonaws.com/*"], None)
    policy = parse_policy_text(got.text)
    shipped = parse_policy_text(yaml.safe_load(SHIPPED)["data"]["policy.yaml"])
    assert [r.allowed_registries for r in policy.rules] == [
        ("docker.io/*", "123456789012.dkr.ecr.us-east-1.amazonaws.com/*")
    ]
    # everything else is the release's
    assert dataclasses.replace(policy.rules[0], allowed_registries=("x",)) == (
        dataclasses.replace(shipped.rules[0], allowed_registries=("x",))
    )
    assert got.lines[1] == (
        "  rule set 'default' (enforce) for every namespace: registries docker.io/*, "
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/*; profiles rollout, eval"
    )


@pytest.mark.parametrize(
    ("registries", "local_harness", "why"),
    [
        (["127.0.0.1:5000/*"], False, "admits images only from a loopback registry"),
        (["localhost:5000/*", "127.0.0.1:5000/*"], False, "--local-harness"),
        (["ghcr.io"], False, "must be '*' or name a registry host then a path"),
        ([], False, "--allow-registry GLOB (repeatable"),
    ],
)
def test_refused_choices(registries: list[str], local_harness: bool, why: str) -> None:
    with pytest.raises(PolicyChoiceError, match=re.escape(why)):
        choose(registries, None, local_harness=local_harness)


def test_local_harness_says_so() -> None:
    got = choose(["127.0.0.1:5000/*"], None, local_harness=True)
    assert "registries 127.0.0.1:5000/*" in got.lines[1]
    assert choose([], None, local_harness=True).origin == "the release's policy (--local-harness)"


def test_policy_file_as_is_or_refused(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("rules:\n- name: ecr\n  mode: warn\n  allowedRegistries: ['*.ecr/*']\n")
    with pytest.raises(PolicyChoiceError, match="the webhook would reject this policy"):
        choose([], f)
    f.write_text("rules:\n- name: gar\n  allowedRegistries: ['us-docker.pkg.dev/proj/*']\n")
    got = choose([], f)
    assert got.text == f.read_text()
    with pytest.raises(PolicyChoiceError, match="together"):
        choose(["docker.io/*"], f)
    cm = tmp_path / "cm.yaml"
    cm.write_text(SHIPPED)  # a ConfigMap manifest: its policy.yaml, and that one is local-only
    with pytest.raises(PolicyChoiceError, match="loopback"):
        choose([], cm)
    with pytest.raises(PolicyChoiceError, match="No such file"):
        choose([], tmp_path / "missing.yaml")


def test_the_overlay_carries_the_policy_as_a_patch(tmp_path: Path) -> None:
    text = choose(["ghcr.io/acme/*"], None).text
    opts = render.InstallOptions(version="1.2.3", policy=text)
    assert render.kustomization(opts, "x")["patches"][0] == {"path": "policy.yaml"}
    ap.write_overlay(tmp_path, opts)
    patch = yaml.safe_load((tmp_path / "policy.yaml").read_text())
    assert patch["metadata"] == {"name": "sandman-policy", "namespace": "sandman-system"}
    assert patch["data"]["policy.yaml"] == text
    assert "allowedRegistries: [ghcr.io/acme/*]" in (tmp_path / "policy.yaml").read_text()
    # the harness (no policy) keeps its base's
    assert "patches" not in render.kustomization(render.InstallOptions(version="1"), "x")


@pytest.mark.skipif(not KUBECTL.exists(), reason="the harness's kubectl is not built")
def test_rendered_configmap_holds_the_chosen_policy(tmp_path: Path) -> None:
    text = choose(["docker.io/*"], None).text
    ap.write_overlay(tmp_path / "ov", render.InstallOptions(version="1.2.3", policy=text))
    argv = [str(KUBECTL), "kustomize", str(tmp_path / "ov")]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    [cm] = [
        d
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "sandman-policy"
    ]
    assert cm["data"]["policy.yaml"] == text
    assert cm["metadata"]["labels"] == {"app.kubernetes.io/part-of": "sandman"}  # merged
    rules = parse_policy_text(cm["data"]["policy.yaml"]).rules
    assert rules[0].allowed_registries == ("docker.io/*",)
