"""`sandman policy check FILE`: offline, the webhook's parser and words; exit 0 / 1 / 2."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sandman.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
HUB = """apiVersion: sandman.dev/v1alpha1
kind: SandboxPolicy
rules:
- name: default
  allowedRegistries: ["docker.io/*", "ghcr.io/acme/*"]
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["policy", "check", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return str(path)


def test_a_good_policy_and_an_admitted_image(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, err = run(capsys, write(tmp_path, HUB), "--image", "python:3.11")
    assert code == 0, err
    assert out.splitlines() == [
        "policy: 1 rule set(s)",
        "  rule set 'default' (enforce) for every namespace: registries docker.io/*, "
        "ghcr.io/acme/*; profiles rollout",
        "python:3.11: admitted: docker.io/library/python:3.11 matches 'docker.io/*' of rule "
        "set 'default' (enforce)",
    ]
    assert err == ""


def test_a_denied_image_is_a_problem_in_the_webhooks_words(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(capsys, write(tmp_path, HUB), "--image", "quay.io/acme/tool:1")
    assert code == 1
    assert (
        "quay.io/acme/tool:1: denied: sandman policy 'default' (enforce): [registry] "
        "container main: image 'quay.io/acme/tool:1' is not from an allowed registry; fix: "
        "use an image matching one of ['docker.io/*', 'ghcr.io/acme/*']"
    ) in out


def test_parse_errors_name_the_field(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = HUB.replace('["docker.io/*", "ghcr.io/acme/*"]', '"docker.io/*"')
    code, out, err = run(capsys, write(tmp_path, bad))
    assert code == 1 and out == ""
    assert err.strip() == (
        "error: the webhook would reject this policy (and keep the previous one): "
        "rule default.allowedRegistries: expected a list, got a string 'docker.io/*'"
    )


def test_the_shipped_policy_admits_nothing_outside_the_harness(capsys) -> None:  # type: ignore[no-untyped-def]
    shipped = str(ROOT / "manifests/webhook/policy.yaml")  # a ConfigMap manifest
    code, out, err = run(capsys, shipped)
    assert code == 1
    assert "registries 127.0.0.1:5000/*" in out
    assert "warning: rule set 'default' admits images only from a loopback registry" in err
    assert "error: this policy admits no image from outside a loopback registry" in err
    assert "--local-harness" in err
    code, _, err = run(capsys, shipped, "--local-harness")
    assert code == 0 and err == ""


def test_warnings_alone_are_not_problems(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run(capsys, write(tmp_path, "rules: [{name: any}]\n"))
    assert code == 0
    assert err.startswith("warning: rule set 'any' allows images from every registry ('*')")


def test_profile_and_namespace_labels(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    text = HUB.replace(
        "- name: default", "- name: team\n  namespaceSelector: {matchLabels: {t: a}}"
    )
    path = write(tmp_path, text)
    code, out, _ = run(
        capsys, path, "--image", "python:3.11", "--profile", "eval", "--namespace-labels", "t=a"
    )
    assert code == 1 and "[profile] unknown profile 'eval'" in out
    code, out, _ = run(capsys, path, "--image", "python:3.11", "--namespace-labels", "t=b")
    assert code == 0 and "of rule set 'built-in-default'" in out


def test_stdin(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("sys.stdin", io.StringIO(HUB))
    assert run(capsys, "-")[0] == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["/nonexistent/policy.yaml"],
        ["POLICY", "--namespace-labels", "novalue"],
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, capsys, argv: list[str]) -> None:  # type: ignore[no-untyped-def]
    argv = [write(tmp_path, HUB) if a == "POLICY" else a for a in argv]
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.startswith("error: ")
    with pytest.raises(SystemExit) as e:
        main(["policy", "check"])  # no FILE: argparse's usage error
    assert e.value.code == 2
