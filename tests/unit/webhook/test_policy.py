"""Policy parsing, rule selection, each check, and the review's modes."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandman.contract import ANN_EXPIRES_AT, ANN_TTL, LABEL_ID, LABEL_SANDBOX
from sandman.webhook.checks import CHECKS, check
from sandman.webhook.mutate import InjectionSettings
from sandman.webhook.policy import Policy, PolicyError, parse_policy
from sandman.webhook.review import (
    Context,
    MalformedReview,
    decide_mutation,
    decide_validation,
    parse_review,
)

POLICY = yaml.safe_load("""
apiVersion: sandman.dev/v1alpha1
kind: SandboxPolicy
rules:
- name: research
  namespaceSelector: {matchLabels: {team: research}}
  mode: warn
  allowedRegistries: ["127.0.0.1:5000/*"]
- name: strict
  namespaceSelector:
    matchExpressions: [{key: tier, operator: In, values: [prod]}]
  mode: enforce
  allowedRegistries: ["127.0.0.1:5000/*"]
  runtimeClassName: gvisor
  resources:
    max: {cpu: "2", memory: 4Gi, ephemeral-storage: 10Gi}
  ttl: {default: 1h, max: 4h}
  idleTimeout: {default: 10m, max: 1h}
  profiles:
    eval: {guaranteedQoS: true, nodeSelector: {pool: eval}}
- name: audit-all
  mode: audit
""")
NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def sandbox(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "labels": {LABEL_SANDBOX: "true"}, "annotations": {}},
        "spec": {
            "automountServiceAccountToken": False,
            "runtimeClassName": "gvisor",
            # As the mutating webhook leaves it: NET_RAW dropped (capability-drop).
            "containers": [
                {
                    "name": "main",
                    "image": "127.0.0.1:5000/t:1",
                    "securityContext": {"capabilities": {"drop": ["NET_RAW"]}},
                }
            ],
            **spec,
        },
    }


def test_rule_selection_by_namespace_labels() -> None:
    policy = parse_policy(POLICY)
    assert policy.select({"team": "research"}).name == "research"
    assert policy.select({"tier": "prod"}).name == "strict"
    assert policy.select({"tier": "dev"}).name == "audit-all"  # no selector: matches all
    assert Policy(()).select({}).name == "built-in-default"


@pytest.mark.parametrize(
    "bad",
    [
        {"rules": [{"mode": "block"}]},
        {"rules": [{"ttl": {"default": "2h", "max": "1h"}}]},
        {"rules": [{"resources": {"max": {"gpu": 1}}}]},
        {"rules": [{"resources": {"max": {"cpu": "lots"}}}]},
        {"rules": [{"allowedRegistry": ["typo"]}]},
        {"rules": [{"defaultProfile": "missing"}]},
        {"kind": "Other"},
    ],
)
def test_invalid_policies_are_rejected(bad: dict[str, Any]) -> None:
    with pytest.raises(PolicyError):
        parse_policy(bad)


STRICT = parse_policy(POLICY).select({"tier": "prod"})


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        (lambda p: p["spec"]["containers"][0].update(image="docker.io/evil:1"), "registry"),
        # privileged holds every capability, NET_RAW included: capability-drop too
        (
            lambda p: p["spec"]["containers"][0].update(securityContext={"privileged": True}),
            "privileged capability-drop",
        ),
        (
            lambda p: p["spec"]["containers"][0].update(
                securityContext={"capabilities": {"add": ["NET_ADMIN"], "drop": ["NET_RAW"]}}
            ),
            "capabilities",
        ),
        (lambda p: p["spec"].update(hostNetwork=True), "host-namespaces"),
        (lambda p: p["spec"].update(hostPID=True), "host-namespaces"),
        (
            lambda p: p["spec"]["containers"][0].update(
                ports=[{"containerPort": 80, "hostPort": 80}]
            ),
            "host-ports",
        ),
        (
            lambda p: p["spec"].update(volumes=[{"name": "h", "hostPath": {"path": "/"}}]),
            "host-paths",
        ),
        (lambda p: p["spec"].update(automountServiceAccountToken=True), "service-account-token"),
        (lambda p: p["spec"].pop("runtimeClassName"), "runtime-class"),
        (
            lambda p: p["spec"]["containers"][0].update(resources={"limits": {"memory": "8Gi"}}),
            "resources-max",
        ),
        (
            lambda p: p["spec"]["containers"][0].update(
                resources={"requests": {"ephemeral-storage": "20Gi"}}
            ),
            "resources-max",
        ),
        (lambda p: p["metadata"]["annotations"].update({ANN_TTL: "5h"}), "ttl-max"),
        (
            lambda p: p["metadata"]["annotations"].update({"sandman.dev/idle-timeout": "2h"}),
            "idle-timeout-max",
        ),
        (lambda p: p["metadata"]["annotations"].update({"sandman.dev/profile": "nope"}), "profile"),
        (
            lambda p: (
                p["metadata"]["annotations"].update({"sandman.dev/profile": "eval"}),
                p["spec"].update(nodeSelector={"pool": "eval"}),  # what mutation sets
            ),
            "guaranteed-qos",
        ),
    ],
)
def test_each_rule_reports_itself_with_a_fix(change: Any, rule: str) -> None:
    assert check(sandbox(), STRICT) == []
    p = sandbox()
    change(p)
    violations = check(p, STRICT)
    assert [v.rule for v in violations] == rule.split(), violations
    assert violations[0].fix


def test_the_check_table_is_the_denial_table_of_the_docs() -> None:
    """Every rule id a check may report has a row in docs/policy.md, and vice versa
    for the CREATE-time rows (the UPDATE-only and contract rows live in review)."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "policy.md").read_text()
    documented = set(re.findall(r"`([a-z-]+)`", doc.split("| rule id |", 1)[1].split("\n\n")[0]))
    in_table = {rid for ids, _f in CHECKS for rid in ids}
    assert in_table - documented == set()


def test_trusted_daemon_image_is_exempt_from_the_registry_rule() -> None:
    install = {
        "name": "sandman-install",
        "image": "quay.io/sandman/d:1",
        "securityContext": {"capabilities": {"drop": ["ALL"]}},
    }
    p = sandbox(initContainers=[install])
    assert [v.rule for v in check(p, STRICT)] == ["registry"]
    assert check(p, STRICT, trusted_images=frozenset({"quay.io/sandman/d:1"})) == []


def ctx(policy: Policy, ns_labels: dict[str, str]) -> Context:
    return Context(
        policy=lambda: policy,
        namespace_labels=lambda ns: ns_labels,
        settings=InjectionSettings(daemon_image="127.0.0.1:5000/sandman/daemon:t", version="1"),
        now=lambda: NOW,
        new_id=lambda: "id1",
        token_hash_for=lambda ns, sid: "0" * 64,
    )


def review(
    obj: dict[str, Any], op: str = "CREATE", old: Any = None, namespace: str = "team-a"
) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"kind": "Pod"},
            "operation": op,
            "namespace": namespace,
            "object": obj,
            "oldObject": old,
        },
    }


def test_enforce_denies_with_rule_and_fix() -> None:
    bad = sandbox()
    bad["spec"]["containers"][0]["image"] = "docker.io/evil:1"
    out = decide_validation(ctx(parse_policy(POLICY), {"tier": "prod"}), parse_review(review(bad)))
    resp = out.response("u-1")["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == 403
    msg = resp["status"]["message"]
    assert "[registry]" in msg and "fix: use an image matching" in msg and "'strict'" in msg


def test_warn_admits_with_warnings_and_audit_admits_silently() -> None:
    bad = sandbox()
    bad["spec"]["containers"][0]["image"] = "docker.io/evil:1"
    warned = decide_validation(
        ctx(parse_policy(POLICY), {"team": "research"}), parse_review(review(bad))
    )
    assert warned.allowed and warned.result == "warned"
    assert any("[registry]" in w for w in warned.response("u-1")["response"]["warnings"])
    bad["spec"]["hostNetwork"] = True
    audited = decide_validation(ctx(parse_policy(POLICY), {}), parse_review(review(bad)))
    assert audited.allowed and audited.result == "audited"
    assert "warnings" not in audited.response("u-1")["response"]


def test_mutation_review_returns_a_base64_json_patch() -> None:
    out = decide_mutation(ctx(Policy(()), {}), parse_review(review(sandbox())))
    resp = out.response("u-1")["response"]
    assert resp["allowed"] and resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    assert any(o["path"] == "/spec/schedulerName" for o in ops)
    plain = sandbox()
    plain["metadata"]["labels"] = {}
    assert decide_mutation(ctx(Policy(()), {}), parse_review(review(plain))).patch is None
    kube = decide_mutation(
        ctx(Policy(()), {}), parse_review(review(sandbox(), namespace="kube-system"))
    )
    assert kube.result == "skipped"


def test_updates_keep_the_lease_within_policy_and_labels_in_place() -> None:
    c = ctx(parse_policy(POLICY), {"tier": "prod"})
    old = sandbox()
    old["metadata"]["creationTimestamp"] = "2026-11-30T12:00:00Z"
    old["metadata"]["labels"][LABEL_ID] = "id1"
    old["metadata"]["annotations"][ANN_EXPIRES_AT] = "2026-11-30T13:00:00Z"

    def update(f: Any) -> Any:
        new = json.loads(json.dumps(old))
        f(new)
        return decide_validation(c, parse_review(review(new, "UPDATE", old)))

    ok = update(
        lambda n: n["metadata"]["annotations"].update({ANN_EXPIRES_AT: "2026-11-30T16:00:00Z"})
    )
    assert ok.allowed  # exactly creation + max TTL (4h)
    late = update(
        lambda n: n["metadata"]["annotations"].update({ANN_EXPIRES_AT: "2026-11-30T16:00:01Z"})
    )
    assert not late.allowed and late.rule_ids == ["lease-max"]
    assert not update(lambda n: n["metadata"]["labels"].pop(LABEL_SANDBOX)).allowed
    assert not update(lambda n: n["metadata"]["labels"].update({LABEL_ID: "other"})).allowed


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1", "request": {}},
        {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": 1}},
        {
            "kind": "AdmissionReview",
            "apiVersion": "admission.k8s.io/v1",
            "request": {"uid": "u", "operation": "CREATE"},
        },
    ],
)
def test_malformed_reviews_raise(body: dict[str, Any]) -> None:
    with pytest.raises(MalformedReview):
        parse_review(body)


def test_pool_controllers_cannot_delete_a_claimed_pod_but_others_can() -> None:
    claimed = sandbox()
    claimed["metadata"]["labels"]["sandman.dev/state"] = "claimed"
    held = sandbox()  # first phase of a two-phase claim: still idle, but held
    held["metadata"]["labels"].update({"sandman.dev/state": "idle", "sandman.dev/claim": "held"})
    idle = sandbox()
    idle["metadata"]["labels"]["sandman.dev/state"] = "idle"
    c = ctx(parse_policy(POLICY), {})

    def delete(old: dict[str, Any], user: str) -> Any:
        body = review({}, op="DELETE", old=old)
        body["request"]["object"] = None
        body["request"]["userInfo"] = {"username": user}
        return decide_validation(c, parse_review(body))

    rs = "system:serviceaccount:kube-system:replicaset-controller"
    gc = "system:serviceaccount:kube-system:generic-garbage-collector"
    for user in (rs, gc):
        out = delete(claimed, user)
        assert not out.allowed and out.rule_ids == ["claimed-pod"]
        assert "sandman.dev/claim=held" in out.message and user in out.message
        assert not delete(held, user).allowed
        assert delete(idle, user).allowed  # scaling a pool down is fine
    assert delete(claimed, "alice").allowed  # the user (or the reaper) may release it
    assert delete(claimed, "system:serviceaccount:sandman-system:sandman-reaper").allowed


@pytest.mark.parametrize("value", ["99999999999d", "1" + "0" * 50 + "s", "3651d"])
def test_huge_durations_are_denied_with_a_clear_message_not_a_500(value: str) -> None:
    p = sandbox()
    p["metadata"]["annotations"][ANN_TTL] = value
    out = decide_mutation(ctx(parse_policy(POLICY), {"tier": "prod"}), parse_review(review(p)))
    assert not out.allowed and out.rule_ids == ["contract"]
    assert "out of range; use at most 3650d" in out.message
    c = ctx(parse_policy(POLICY), {"tier": "prod"})
    checked = decide_validation(c, parse_review(review(p)))
    assert not checked.allowed and checked.rule_ids == ["ttl-format"]


def test_an_idle_maximum_without_a_default_is_the_default() -> None:
    # Else a pod that names no idle timeout would have none, past the maximum.
    rule = parse_policy({"rules": [{"name": "r", "idleTimeout": {"max": "1h"}}]}).rules[0]
    assert rule.default_idle_timeout == rule.max_idle_timeout == dt.timedelta(hours=1)


def test_the_daemons_shared_node_directory_is_the_only_trusted_host_path() -> None:
    shared = "/var/lib/sandman/daemon"
    c = ctx(Policy(()), {})
    c = Context(
        **{**c.__dict__, "settings": InjectionSettings("d:1", "1", daemon_shared_dir=shared)}
    )
    ours = sandbox(volumes=[{"name": "sandman-daemon-shared", "hostPath": {"path": shared}}])
    assert decide_validation(c, parse_review(review(ours))).allowed
    for name, path in (("sandman-daemon-shared", "/"), ("mine", shared)):
        other = sandbox(volumes=[{"name": name, "hostPath": {"path": path}}])
        out = decide_validation(c, parse_review(review(other)))
        assert not out.allowed and out.rule_ids == ["host-paths"]
