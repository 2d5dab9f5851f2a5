"""The run's placement, decided before any pod exists: worked examples.

Each example is a cluster (its nodes), the placement the webhook gave a task
pod of the profile (from a dry run) and whether the user requires dedicated
nodes; the decision says where the tasks go and, when they cannot go where
asked, which condition fails and the commands that meet it.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sandman.eval import placement
from sandman.eval.placement import (
    DEDICATED,
    REFUSED,
    SHARED,
    UNKNOWN,
    Node,
    Placement,
    decide,
    pod_requests,
    tolerated,
)

KEY = "sandman.dev/dedicated"
TOLERATION = {"key": KEY, "operator": "Equal", "value": "eval", "effect": "NoSchedule"}
TAINT = {"key": KEY, "value": "eval", "effect": "NoSchedule"}
SIZE = {"cpu": Decimal(1), "memory": Decimal(2**30)}
# The shipped eval profile: tolerates the dedicated nodes' taint, requires nothing.
SHIPPED = Placement({}, (TOLERATION,), SIZE)
# A profile that requires dedicated nodes (the admin's choice).
STRICT = Placement({KEY: "eval"}, (TOLERATION,), SIZE)
LABEL_CMD = "kubectl label node {n} sandman.dev/dedicated=eval"
TAINT_CMD = "kubectl taint node {n} sandman.dev/dedicated=eval:NoSchedule"


def node(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    cpu: str = "4",
    memory: str = "8Gi",
    ready: bool = True,
    cordoned: bool = False,
) -> Node:
    raw: dict[str, Any] = {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": taints or [], "unschedulable": cordoned},
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
    return Node.of(raw)


def dedicated(name: str, **kw: Any) -> Node:
    return node(name, labels={KEY: "eval"}, taints=[TAINT], **kw)


def test_a_fresh_install_runs_on_shared_nodes_and_says_how_to_dedicate_one() -> None:
    d = decide("eval", [SHIPPED], [node("worker-a"), node("worker-b")])
    assert d.verdict == SHARED and d.dedicated is False
    assert d.nodes == ("worker-a", "worker-b") and d.pin == {}
    assert (
        d.reason == "no node is labelled sandman.dev/dedicated=eval (dedicated to profile 'eval')"
    )
    assert LABEL_CMD.format(n="worker-a") in d.fix and TAINT_CMD.format(n="worker-a") in d.fix
    rec = d.record()
    assert rec["dedicated_nodes"] is False and rec["verdict"] == "shared"
    assert rec["label"] == "sandman.dev/dedicated=eval" and rec["reason"] == d.reason


def test_requiring_dedicated_nodes_refuses_the_fresh_install_up_front() -> None:
    d = decide("eval", [SHIPPED], [node("worker-a")], require_dedicated=True)
    assert d.verdict == REFUSED and d.dedicated is None
    msg = d.message()
    assert msg.startswith("--require-dedicated: no node is labelled sandman.dev/dedicated=eval")
    assert LABEL_CMD.format(n="worker-a") in msg and TAINT_CMD.format(n="worker-a") in msg
    assert "or run without --require-dedicated" in msg


def test_dedicated_nodes_are_used_and_pinned() -> None:
    nodes = [node("worker-a"), dedicated("eval-1"), dedicated("eval-2")]
    for require in (False, True):
        d = decide("eval", [SHIPPED], nodes, require_dedicated=require)
        assert d.verdict == DEDICATED and d.dedicated is True
        # The profile only tolerates them: the runner adds the label to the pods.
        assert d.pin == {KEY: "eval"} and d.nodes == ("eval-1", "eval-2")
        assert d.reason == "" and d.record()["pinned"] == {KEY: "eval"}


def test_a_profile_that_requires_the_label_is_kept_not_overridden() -> None:
    # A dedicated node: nothing to add, the webhook's selector already pins.
    d = decide("eval", [STRICT], [node("worker-a"), dedicated("eval-1")])
    assert d.verdict == DEDICATED and d.pin == {} and d.nodes == ("eval-1",)
    # None: refused before anything is created (the old "every task infra_failed").
    d = decide("eval", [STRICT], [node("worker-a"), node("worker-b")])
    assert d.verdict == REFUSED
    assert d.reason == (
        "no node can run the tasks' pods of profile 'eval': "
        "worker-a: not labelled sandman.dev/dedicated=eval (the profile's nodeSelector); "
        "worker-b: not labelled sandman.dev/dedicated=eval (the profile's nodeSelector)"
    )
    assert LABEL_CMD.format(n="worker-a") in d.fix and TAINT_CMD.format(n="worker-a") in d.fix
    assert "remove nodeSelector sandman.dev/dedicated from profile 'eval'" in d.fix


def test_a_labelled_node_that_is_not_dedicated_says_what_it_lacks() -> None:
    nodes = [
        node("worker-a"),
        node("untainted", labels={KEY: "eval"}),
        dedicated("small", cpu="500m"),
        dedicated("down", ready=False),
        dedicated("drained", cordoned=True),
    ]
    d = decide("eval", [SHIPPED], nodes)
    assert d.verdict == SHARED and d.dedicated is False
    # Every node the tasks fit on, the untainted labelled one included.
    assert d.nodes == ("untainted", "worker-a")
    assert d.reason == (
        "no node is dedicated to profile 'eval': "
        "untainted: not tainted sandman.dev/dedicated=eval:NoSchedule (other pods can share it); "
        "small: allocatable cpu 0.5 is less than a task pod's 1; "
        "down: not Ready; drained: cordoned"
    )
    # The fix names a node the tasks fit on.
    assert LABEL_CMD.format(n="untainted") in d.fix


def test_a_profile_that_does_not_tolerate_the_taint_is_told_to() -> None:
    # The local cluster's eval profile has no tolerations at all.
    bare = Placement({}, (), SIZE)
    d = decide("eval", [bare], [node("worker-a"), dedicated("eval-1")])
    assert d.verdict == SHARED and d.nodes == ("worker-a",)
    assert "eval-1: tainted sandman.dev/dedicated=eval:NoSchedule, which the profile does not" in (
        d.reason
    )
    assert f"the toleration {TAINT}" in d.fix and "profile 'eval'" in d.fix


def test_every_task_size_needs_a_dedicated_node() -> None:
    big = Placement({}, (TOLERATION,), {"cpu": Decimal(8), "memory": Decimal(2**30)})
    nodes = [node("worker-a", cpu="16"), dedicated("eval-1", cpu="4")]
    d = decide("eval", [SHIPPED, big], nodes)
    # The big tasks fit only on the shared node: the run is shared, not half-pinned.
    assert d.verdict == SHARED and d.pin == {}
    assert "eval-1: allocatable cpu 4 is less than a task pod's 8" in d.reason
    assert decide("eval", [SHIPPED, big], nodes, require_dedicated=True).verdict == REFUSED


def test_nowhere_to_run_at_all() -> None:
    kwok = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
    d = decide("eval", [SHIPPED], [node("kwok-0", taints=[kwok])])
    assert d.verdict == REFUSED
    assert d.reason == (
        "no node can run the tasks' pods of profile 'eval': kwok-0: tainted "
        "kwok.x-k8s.io/node=fake:NoSchedule, which the profile does not tolerate"
    )
    assert d.fix == "make a node match the profile's nodeSelector and tolerations (docs/policy.md)"
    assert decide("eval", [SHIPPED], []).reason == "the cluster has no nodes"
    many = [node(f"n{i}", ready=False) for i in range(8)]
    assert decide("eval", [SHIPPED], many).reason.endswith("n4: not Ready; and 3 more")


def test_nodes_not_listed_or_no_pod_admitted() -> None:
    why = "listing them failed: HTTP 403"
    d = decide("eval", [SHIPPED], None, nodes_error=why)
    assert d.verdict == UNKNOWN and d.dedicated is None and d.pin == {}
    assert d.reason.startswith(f"the nodes were not checked ({why}): ")
    assert "nodes get, list" in d.fix
    # Required without a look at the nodes (not allowed, or an autoscaler adds
    # them on demand): pinned, and each task's node is checked as it starts.
    d = decide("eval", [SHIPPED], None, require_dedicated=True, nodes_error="--skip-node-check")
    assert d.verdict == DEDICATED and d.pin == {KEY: "eval"}
    assert "each task's node is checked as it starts" in d.reason
    # The profile's own selector pins them already.
    d = decide("eval", [STRICT], None, nodes_error=why)
    assert d.verdict == DEDICATED and d.pin == {}
    # The webhook refused every dry run: the tasks fail with its reason, one by one.
    assert decide("eval", [], [node("worker-a")]).verdict == UNKNOWN


def test_a_pods_requests_as_the_scheduler_counts_them() -> None:
    pod = {
        "spec": {
            "initContainers": [
                {"name": "install", "resources": {"limits": {"cpu": "2", "memory": "64Mi"}}},
                {"name": "sidecar", "restartPolicy": "Always",
                 "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}}},
            ],
            "containers": [
                {"name": "main", "resources": {"requests": {"cpu": "500m"},
                                               "limits": {"cpu": "1", "memory": "1Gi"}}},
                {"name": "other", "resources": {}},
            ],
            "overhead": {"memory": "16Mi"},
        }
    }  # fmt: skip
    # cpu: max(init 2, 0.5 + 0.1); memory: the main's limit as its request + sidecar + overhead.
    assert pod_requests(pod) == {"cpu": Decimal(2), "memory": Decimal((1024 + 32 + 16) * 2**20)}
    p = Placement.of_pod({"spec": {"nodeSelector": {"a": "b"}, "tolerations": [TOLERATION]}})
    assert p.node_selector == {"a": "b"} and p.tolerations == (TOLERATION,) and p.requests == {}


def test_tolerations_match_as_kubernetes_matches_them() -> None:
    assert tolerated(TAINT, [TOLERATION])
    assert tolerated(TAINT, [{"key": KEY, "operator": "Exists"}])
    assert tolerated(TAINT, [{"operator": "Exists"}])  # no key: every taint
    assert tolerated(TAINT, [{"key": KEY, "value": "eval"}])  # Equal by default, any effect
    assert not tolerated(TAINT, [{"key": KEY, "value": "gpu"}])
    assert not tolerated(TAINT, [{**TOLERATION, "effect": "NoExecute"}])
    assert not tolerated(TAINT, [])
    assert placement.setup_commands("eval", "n1") == (
        f"{LABEL_CMD.format(n='n1')} && {TAINT_CMD.format(n='n1')}"
    )
