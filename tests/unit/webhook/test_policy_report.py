"""What `sandman policy check` and `sandman install` say about a policy: worked examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandman.contract import LABEL_SANDBOX
from sandman.webhook import policy_report as r
from sandman.webhook.checks import check
from sandman.webhook.policy import PolicyError, parse_policy_text

ROOT = Path(__file__).resolve().parents[3]

HUB = """
rules:
- name: hub
  allowedRegistries: ["docker.io/*", "ghcr.io/acme/*"]
  profiles: {eval: {reuse: false}}
"""
LOCAL = """
rules:
- name: local
  allowedRegistries: ["127.0.0.1:5000/*"]
"""


def sandbox(image: str) -> dict:  # type: ignore[type-arg]
    return {
        "metadata": {"labels": {LABEL_SANDBOX: "true"}},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": image}],
        },
    }


def registry(image: str, text: str) -> list:  # type: ignore[type-arg]
    """The registry rule's violations for a sandbox of ``image`` (the other rules aside)."""
    return [
        v for v in check(sandbox(image), parse_policy_text(text).rules[0]) if v.rule == "registry"
    ]


# -- the webhook's registry rule on normalised references ---------------------------
@pytest.mark.parametrize(
    "image",
    ["python:3.11", "library/python:3.11", "docker.io/python:3.11", "index.docker.io/python"],
)
def test_familiar_names_are_docker_hub_for_the_registry_rule(image: str) -> None:
    assert registry(image, HUB) == []


def test_a_denial_names_the_rule_the_normal_form_and_the_fix() -> None:
    [v] = registry("python:3.11", LOCAL)
    assert v.rule == "registry"
    assert "'python:3.11' (docker.io/library/python:3.11) is not from an allowed" in v.message
    assert v.fix == "use an image matching one of ['127.0.0.1:5000/*']"


def test_a_malformed_reference_is_denied_saying_why() -> None:
    [v] = registry("Python:3.11", HUB)
    assert v.rule == "registry"
    assert "not a valid image reference" in v.message and "lower case" in v.message
    assert "[REGISTRY/]REPOSITORY[:TAG]" in v.fix


def test_patterns_are_kept_in_normal_form() -> None:
    text = 'rules: [{name: a, allowedRegistries: ["index.docker.io/python:*", "acme/*"]}]'
    rule = parse_policy_text(text).rules[0]
    assert rule.allowed_registries == ("docker.io/library/python:*", "docker.io/acme/*")


# -- the report ------------------------------------------------------------------------
def test_loopback_only_policies() -> None:
    assert r.admits_only_loopback(parse_policy_text(LOCAL))
    assert not r.admits_only_loopback(parse_policy_text(HUB))
    # a rule set for some namespaces only: the others get the built-in default ('*')
    scoped = "rules: [{name: a, namespaceSelector: {matchLabels: {t: x}}, " + (
        'allowedRegistries: ["localhost:5000/*"]}]'
    )
    assert not r.admits_only_loopback(parse_policy_text(scoped))
    # warn mode admits what it warns about
    warn = 'rules: [{name: a, mode: warn, allowedRegistries: ["127.0.0.1:5000/*"]}]'
    assert not r.admits_only_loopback(parse_policy_text(warn))
    # a later rule set behind a catch-all changes nothing
    shadow = LOCAL + '- name: never\n  allowedRegistries: ["docker.io/*"]\n'
    assert r.admits_only_loopback(parse_policy_text(shadow))


def test_the_shipped_policy_admits_only_the_local_harness() -> None:
    text = r.policy_text((ROOT / "manifests/webhook/policy.yaml").read_text())
    assert r.admits_only_loopback(parse_policy_text(text))


def test_warnings() -> None:
    shadow = LOCAL + '- name: never\n  allowedRegistries: ["*"]\n'
    got = r.warnings(parse_policy_text(shadow))
    assert len(got) == 2
    assert got[0].startswith("rule set 'local' admits images only from a loopback registry")
    assert got[1] == (
        "rule set 'never' never applies: rule set 'local' before it selects every "
        "namespace (the first match wins)"
    )
    assert r.warnings(parse_policy_text(shadow), local_harness=True) == [got[1]]
    assert r.warnings(parse_policy_text("rules: []"))[0].startswith(
        "the built-in defaults allows images from every registry ('*')"
    )
    assert r.warnings(parse_policy_text(HUB)) == []


def test_summary_says_mode_registries_and_profiles_per_rule_set() -> None:
    scoped = "rules: [{name: a, namespaceSelector: {matchLabels: {t: x}}}]"
    assert r.summary(parse_policy_text(scoped)) == [
        "rule set 'a' (enforce) for namespaces labelled t=x: registries *; profiles rollout",
        "built-in defaults (enforce) for namespaces no rule set selects: registries *; "
        "profiles rollout",
    ]
    assert r.summary(parse_policy_text(HUB)) == [
        "rule set 'hub' (enforce) for every namespace: registries docker.io/*, "
        "ghcr.io/acme/*; profiles rollout, eval"
    ]


def test_image_verdicts_in_the_webhooks_words() -> None:
    policy = parse_policy_text(HUB)
    [ok] = r.image_verdicts(policy, "python:3.11")
    assert ok.admitted
    assert ok.message == (
        "admitted: docker.io/library/python:3.11 matches 'docker.io/*' of rule set 'hub' (enforce)"
    )
    [no] = r.image_verdicts(policy, "quay.io/x/y:1")
    assert not no.admitted
    assert no.message == (
        "denied: sandman policy 'hub' (enforce): [registry] container main: image "
        "'quay.io/x/y:1' is not from an allowed registry; fix: use an image matching one "
        "of ['docker.io/*', 'ghcr.io/acme/*']"
    )
    [prof] = r.image_verdicts(policy, "python:3.11", profile="nope")
    assert not prof.admitted and "[profile] unknown profile 'nope'" in prof.message
    [eval_] = r.image_verdicts(policy, "python:3.11", profile="eval")
    assert eval_.admitted


def test_image_verdict_for_a_namespace_uses_its_rule_set() -> None:
    text = (
        "rules:\n- name: team\n  namespaceSelector: {matchLabels: {team: a}}\n"
        '  allowedRegistries: ["ghcr.io/a/*"]\n- name: rest\n  mode: warn\n'
        '  allowedRegistries: ["ghcr.io/rest/*"]\n'
    )
    policy = parse_policy_text(text)
    [v] = r.image_verdicts(policy, "ghcr.io/a/x:1", namespace_labels={"team": "a"})
    assert v.admitted and v.rule.name == "team"
    [w] = r.image_verdicts(policy, "ghcr.io/a/x:1", namespace_labels={})
    assert w.admitted and w.message.startswith("admitted in warn mode, with: sandman policy")
    assert [v.rule.name for v in r.image_verdicts(policy, "ghcr.io/a/x:1")] == ["team", "rest"]


def test_a_configmap_manifest_is_read_at_the_webhooks_key() -> None:
    cm = "apiVersion: v1\nkind: ConfigMap\ndata:\n  policy.yaml: |\n    rules: []\n"
    assert r.policy_text(cm) == "rules: []\n"
    with pytest.raises(PolicyError, match=r"no data\.policy\.yaml"):
        r.policy_text("kind: ConfigMap\ndata: {other: x}\n")
    assert r.policy_text(HUB) == HUB
