"""Pull Secrets for Sandman's images: the flags, the overlay's patches, the Secret
`--registry-auth` makes (never printed), and what kustomize renders from them."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from sandman.cli.main import main
from sandman.install import apply as ap
from sandman.install import pullsecrets, render
from sandman.install.images import Registry
from tests.unit.install.test_render import KUBECTL

LOGIN = base64.b64encode(b"platform:s3cret-pw").decode()
CONFIG = json.dumps({"auths": {"reg.example:5000": {"auth": LOGIN}}})


def test_names_are_checked_and_kept_once_in_order() -> None:
    assert pullsecrets.check_names(["b", "a", "b"]) == ("b", "a")
    for bad in ("Regcred", "a_b", "", "-x"):
        with pytest.raises(pullsecrets.PullSecretError, match="not a Secret name"):
            pullsecrets.check_names([bad])


def test_patches_name_the_secrets_in_pod_templates_and_the_webhook_args() -> None:
    assert pullsecrets.patches(()) == []
    deploy, daemonset, webhook = pullsecrets.patches(("regcred", "other"))
    assert deploy["target"] == {"group": "apps", "kind": "Deployment"}
    assert daemonset["target"] == {"group": "apps", "kind": "DaemonSet"}
    (op,) = yaml.safe_load(deploy["patch"])
    assert op == {
        "op": "add",
        "path": "/spec/template/spec/imagePullSecrets",
        "value": [{"name": "regcred"}, {"name": "other"}],
    }
    assert webhook["target"] == {"kind": "Deployment", "name": "sandman-webhook"}
    assert [o["value"] for o in yaml.safe_load(webhook["patch"])] == [
        "--daemon-pull-secret=regcred",
        "--daemon-pull-secret=other",
    ]


def test_the_kustomization_keeps_the_policy_first_and_the_harness_patches_last() -> None:
    extra = {"target": {"kind": "Deployment", "name": "x"}, "patch": "[]"}
    opts = render.InstallOptions(
        version="1", policy="rules: []\n", image_pull_secrets=("regcred",), patches=(extra,)
    )
    patches = render.kustomization(opts, "1")["patches"]
    assert patches[0] == {"path": render.POLICY_FILE}
    assert patches[-1] == extra and len(patches) == 5
    assert "pull secrets regcred" in render.header(opts, "1")


def test_registry_auth_becomes_a_dockerconfigjson_secret() -> None:
    secret = pullsecrets.registry_auth_secret(CONFIG, "auth.json")
    assert secret["metadata"] == {
        "name": "sandman-registry-auth",
        "namespace": "sandman-system",
        "labels": {"app.kubernetes.io/part-of": "sandman"},
    }
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    data = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert data == {"auths": {"reg.example:5000": {"auth": LOGIN}}}


def test_a_config_holding_no_login_is_refused_without_quoting_it() -> None:
    helper = json.dumps({"auths": {"ghcr.io": {}}, "credsStore": "desktop"})
    with pytest.raises(pullsecrets.PullSecretError) as e:
        pullsecrets.registry_auth_secret(helper, "c.json")
    assert "no login for ghcr.io" in str(e.value) and "credential helper" in str(e.value)
    for text, why in (("{not json", "not JSON"), ("{}", "no `auths`")):
        with pytest.raises(pullsecrets.PullSecretError, match=why):
            pullsecrets.registry_auth_secret(text, "c.json")
    bad = json.dumps({"auths": {"r": {"auth": "bm9jb2xvbg=="}}})  # "nocolon"
    with pytest.raises(pullsecrets.PullSecretError) as e:
        pullsecrets.registry_auth_secret(bad, "c.json")
    assert "bm9jb2xvbg" not in str(e.value)


@pytest.mark.skipif(not KUBECTL.exists(), reason="the harness's kubectl is not built")
@pytest.mark.parametrize("delivery", ["copy", "node"])
def test_every_sandman_pod_names_the_secret_once_rendered(tmp_path: Path, delivery: str) -> None:
    opts = render.InstallOptions(
        version="1.0.0",
        registry=Registry.parse("reg.example:5000/acme"),
        delivery=delivery,
        image_pull_secrets=("regcred", pullsecrets.REGISTRY_AUTH_SECRET),
    )
    ap.write_overlay(tmp_path / "ov", opts)
    out = subprocess.run(
        [str(KUBECTL), "kustomize", str(tmp_path / "ov")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    docs = ap.documents(out)
    workloads = [d for d in docs if d["kind"] in ("Deployment", "DaemonSet")]
    assert {d["kind"] for d in workloads} == (
        {"Deployment", "DaemonSet"} if delivery == "node" else {"Deployment"}
    )
    for d in workloads:
        assert d["spec"]["template"]["spec"]["imagePullSecrets"] == [
            {"name": "regcred"},
            {"name": "sandman-registry-auth"},
        ], d["metadata"]["name"]
    (webhook,) = [d for d in docs if d["metadata"]["name"] == "sandman-webhook"
                  and d["kind"] == "Deployment"]  # fmt: skip
    args = webhook["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == [
        "--daemon-pull-secret=regcred",
        "--daemon-pull-secret=sandman-registry-auth",
    ]


@pytest.mark.skipif(not KUBECTL.exists(), reason="the harness's kubectl is not built")
def test_install_dry_run_never_shows_the_login(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(CONFIG)
    dry = ["--dry-run=client", "--kubectl", str(KUBECTL)]
    code = main(["install", "--registry", "reg.example:5000/acme", "--allow-registry",
                 "reg.example:5000/*", "--registry-auth", str(auth), "--image-pull-secret",
                 "regcred", "-o", "yaml", *dry])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "image pull secrets: regcred, sandman-registry-auth" in err
    assert "imagePullSecrets" in out
    for text in (out, err):
        assert LOGIN not in text and "s3cret-pw" not in text
    (tmp_path / "bad.json").write_text("{}")
    bad = ["--registry-auth", str(tmp_path / "bad.json")]
    code = main(["install", "--allow-registry", "x/*", *bad, *dry])
    assert code == 2 and "no `auths`" in capsys.readouterr().err
