"""The controlled conditions: what a pod gets, what is checked on the started pod,
and when NetworkPolicies really keep an offline pod offline."""

from __future__ import annotations

import copy
from typing import Any

from sandman.contract import LABEL_NETWORK, LABEL_RUN, LABEL_SANDBOX, NETWORK_NONE
from sandman.eval import conditions
from sandman.eval.network import OFFLINE_LABELS, offline_policies
from sandman.eval.spec import Grading, Task

DIGEST = "sha256:" + "a" * 64
TASK = Task(
    "t", "127.0.0.1:5000/x:1", Grading(("true",)), resources=(("cpu", "250m"), ("memory", "64Mi"))
)


def started_pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "uid": "u", "annotations": {"sandman.dev/profile": "eval",
                                                              "sandman.dev/injected": "0.1.0"}},
        "spec": {
            "nodeName": "sandman-node",
            "nodeSelector": {"sandman.dev/node-kind": "real"},
            "containers": [{"name": "main", "command": ["/.sandman/rt/bin/sandmand", "serve",
                                                        "--no-reset", "--", "sleep", "1"]}],
        },
        "status": {
            "qosClass": "Guaranteed",
            "containerStatuses": [{"name": "main", "imageID": f"127.0.0.1:5000/x@{DIGEST}"}],
        },
    }  # fmt: skip


def test_pod_settings_are_guaranteed_and_fixed() -> None:
    res = conditions.resources(TASK)
    assert res["requests"] == res["limits"] == {"cpu": "250m", "memory": "64Mi"}
    assert conditions.pod_env(TASK)["PYTHONHASHSEED"] == "0"
    assert conditions.pod_labels(TASK, "r1") == {LABEL_RUN: "r1", LABEL_NETWORK: NETWORK_NONE}
    online = Task("t", "x:1", Grading(("true",)), network=True)
    assert LABEL_NETWORK not in conditions.pod_labels(online, "r1")


def test_a_pod_that_meets_every_condition() -> None:
    pod = started_pod()
    assert conditions.check_pod(pod, digest=DIGEST) == []
    rec = conditions.record(pod, TASK)
    assert rec["node"] == "sandman-node" and rec["no_reset"] and rec["network"] == "none"
    assert rec["node_selector"] == {"sandman.dev/node-kind": "real"}


def test_a_started_container_is_reported_once_the_kubelet_names_its_image() -> None:
    pod = started_pod()
    assert conditions.status_reported(pod)
    # The daemon answered; the kubelet's status has not caught up yet.
    pod["status"]["containerStatuses"] = [{"name": "main", "imageID": ""}]
    assert not conditions.status_reported(pod)
    del pod["status"]["containerStatuses"]
    assert not conditions.status_reported(pod)


def test_each_unmet_condition_is_named() -> None:
    pod = started_pod()
    pod["status"]["qosClass"] = "Burstable"
    pod["status"]["containerStatuses"][0]["imageID"] = "127.0.0.1:5000/x@sha256:" + "b" * 64
    pod["spec"]["containers"][0]["command"].remove("--no-reset")
    pod["metadata"]["annotations"]["sandman.dev/profile"] = "rollout"
    problems = conditions.check_pod(pod, digest=DIGEST)
    assert len(problems) == 4, problems
    assert any("Burstable" in p for p in problems)
    assert any("not the pinned" in p for p in problems)
    assert any("--no-reset" in p for p in problems)


def test_label_selectors() -> None:
    labels = {"a": "1", "b": "2"}
    assert conditions.selects({}, labels)
    assert conditions.selects({"matchLabels": {"a": "1"}}, labels)
    assert not conditions.selects({"matchLabels": {"a": "2"}}, labels)
    expr = lambda op, *v: {"matchExpressions": [{"key": "a", "operator": op, "values": list(v)}]}  # noqa: E731
    assert conditions.selects(expr("In", "1", "3"), labels)
    assert not conditions.selects(expr("NotIn", "1"), labels)
    assert conditions.selects(expr("NotIn", "x"), {})  # NotIn matches a missing key
    assert conditions.selects(expr("Exists"), labels) and not conditions.selects(
        expr("DoesNotExist"), labels
    )


def _policy(
    name: str, selector: dict[str, Any], *, egress: Any = None, types: Any = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"podSelector": selector}
    if types is not None:
        spec["policyTypes"] = types
    if egress is not None:
        spec["egress"] = egress
    return {"metadata": {"name": name}, "spec": spec}


def test_offline_needs_an_isolating_policy_and_no_leaking_one() -> None:
    shipped = offline_policies()
    assert {p["metadata"]["name"] for p in shipped} == {
        "sandman-eval-offline-egress", "sandman-eval-offline-ingress"}  # fmt: skip
    assert conditions.network_isolation(shipped, OFFLINE_LABELS) == (
        True, ["sandman-eval-offline-egress"], [])  # fmt: skip
    # Nothing selects the pod for egress: it has network.
    assert conditions.network_isolation([], OFFLINE_LABELS)[0] is False
    # A namespace-wide policy that allows egress to every sandbox adds up with ours.
    leaky = _policy("sandboxes", {"matchLabels": {LABEL_SANDBOX: "true"}}, egress=[{"to": [{}]}],
                    types=["Egress"])  # fmt: skip
    ok, _, leaking = conditions.network_isolation([*shipped, leaky], OFFLINE_LABELS)
    assert not ok and leaking == ["sandboxes"]
    # ... unless it leaves offline pods out, as manifests/sandbox-namespace does.
    fixed = copy.deepcopy(leaky)
    fixed["spec"]["podSelector"]["matchExpressions"] = [
        {"key": LABEL_NETWORK, "operator": "NotIn", "values": [NETWORK_NONE]}
    ]
    assert conditions.network_isolation([*shipped, fixed], OFFLINE_LABELS)[0] is True
    # Without policyTypes, a policy with egress rules is an egress policy (API default).
    untyped = _policy("untyped", {}, egress=[{"to": [{}]}])
    assert conditions.network_isolation([*shipped, untyped], OFFLINE_LABELS)[2] == ["untyped"]
    # An ingress-only policy does not matter for egress.
    ingress = _policy("in", {}, types=["Ingress"])
    assert conditions.network_isolation([*shipped, ingress], OFFLINE_LABELS)[0] is True


def test_the_shipped_namespace_policies_keep_offline_pods_offline() -> None:
    """Everything manifests/sandbox-namespace applies, together (policies add up)."""
    from importlib import resources

    import yaml

    base = resources.files("sandman.manifests").joinpath("sandbox-namespace")
    files = yaml.safe_load(base.joinpath("kustomization.yaml").read_text())["resources"]
    policies = [d for f in files for d in yaml.safe_load_all(base.joinpath(f).read_text()) if d]
    assert conditions.network_isolation(policies, OFFLINE_LABELS)[0] is True
    # An ordinary sandbox keeps its egress: the offline policies do not select it.
    ok, isolating, leaking = conditions.network_isolation(policies, {LABEL_SANDBOX: "true"})
    assert not ok and leaking == ["sandman-sandboxes-egress"] and isolating == []
