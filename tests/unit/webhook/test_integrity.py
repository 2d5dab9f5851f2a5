"""webhook/integrity.py: the pure readings behind the every-mode rules, by worked
example (the corpus, tests/corpus/admission/integrity*.yaml, holds the
admission cases; these pin how a field is read)."""

from __future__ import annotations

from typing import Any

import pytest

from sandman.contract import LABEL_SANDBOX
from sandman.webhook.checks import check
from sandman.webhook.integrity import (
    RUNTIME_DEFAULT_CAPABILITIES,
    container_path,
    held_capabilities,
    tolerates,
    under_daemon_dir,
)
from sandman.webhook.policy import parse_policy_text
from sandman.webhook.review import _apply_mode

DEFAULTS = RUNTIME_DEFAULT_CAPABILITIES  # containerd's 14, NET_RAW included


def sc(add: list[str] | None = None, drop: list[str] | None = None, **more: Any) -> dict:
    caps = {k: v for k, v in (("add", add), ("drop", drop)) if v is not None}
    return {"name": "c", "securityContext": {"capabilities": caps, **more}}


@pytest.mark.parametrize(
    ("container", "held"),
    [
        # nothing asked: containerd's default set, 14 names
        ({"name": "c"}, DEFAULTS),
        # drop NET_RAW (any case): 14 - 1 = 13
        (sc(drop=["net_raw"]), DEFAULTS - {"NET_RAW"}),
        # CAP_NET_RAW: containerd removes "CAP_CAP_NET_RAW", so still 14
        (sc(drop=["CAP_NET_RAW"]), DEFAULTS),
        # CAP_ALL is no ALL for containerd either
        (sc(drop=["CAP_ALL"]), DEFAULTS),
        # drop ALL, add one back: {NET_BIND_SERVICE}
        (sc(add=["NET_BIND_SERVICE"], drop=["ALL"]), {"NET_BIND_SERVICE"}),
        # add and drop the same name: the drop is applied last, so it is gone
        (sc(add=["NET_RAW"], drop=["NET_RAW"]), DEFAULTS - {"NET_RAW"}),
        # an add with its prefix is read as the capability (errs towards refusing)
        (sc(add=["cap_sys_admin"], drop=["ALL"]), {"SYS_ADMIN"}),
        # privileged: everything
        ({"name": "c", "securityContext": {"privileged": True}}, {"ALL"}),
    ],
)
def test_held_capabilities_as_containerd_computes_them(container: dict, held: set) -> None:
    assert held_capabilities(container) == frozenset(held)


@pytest.mark.parametrize(
    ("path", "resolved", "under"),
    [
        ("/.sandman", "/.sandman", True),
        ("/.sandman/", "/.sandman", True),
        ("//.sandman//rt/", "/.sandman/rt", True),
        ("/.sandman/../.sandman/rt", "/.sandman/rt", True),
        ("/tmp/../.sandman", "/.sandman", True),
        ("/../../.sandman/shared", "/.sandman/shared", True),
        (".sandman/rt", "/.sandman/rt", True),  # relative: from /, as runc reads it
        ("/.sandman-data", "/.sandman-data", False),
        ("/data/.sandman", "/data/.sandman", False),
        ("/.sandman/..", "/", False),
    ],
)
def test_mount_paths_are_read_as_the_runtime_resolves_them(
    path: str, resolved: str, under: bool
) -> None:
    assert container_path(path) == resolved
    assert under_daemon_dir(path) is under


EVAL_TAINT = ("sandman.dev/dedicated", "eval", "NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "admitted"),
    [
        ({"key": "sandman.dev/dedicated", "operator": "Equal", "value": "eval"}, True),
        ({"key": "sandman.dev/dedicated", "value": "eval", "effect": "NoSchedule"}, True),
        ({"key": "sandman.dev/dedicated", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),  # no key: every taint
        ({"operator": "Exists", "effect": "NoExecute"}, False),  # every key, another effect
        ({"key": "sandman.dev/dedicated", "value": "gpu"}, False),
        ({"key": "sandman.dev/dedicated", "value": "eval", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_which_tolerations_admit_a_pod_to_the_eval_nodes(toleration: dict, admitted: bool) -> None:
    assert tolerates(toleration, EVAL_TAINT) is admitted


WARN = parse_policy_text("""
apiVersion: sandman.dev/v1alpha1
kind: SandboxPolicy
rules:
- name: trial
  mode: warn
  allowedRegistries: ["127.0.0.1:5000/*"]
""").rules[0]


def pod(container: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "labels": {LABEL_SANDBOX: "true"}, "annotations": {}},
        "spec": {"automountServiceAccountToken": False, "containers": [container]},
    }


def test_warn_mode_warns_a_preference_but_refuses_an_integrity_rule_naming_both() -> None:
    preference = pod({**sc(drop=["NET_RAW"]), "image": "docker.io/x:1"})
    out = _apply_mode(check(preference, WARN), WARN)
    assert out.allowed and out.result == "warned"

    # The same image and the runtime's NET_RAW kept: refused, and the denial
    # names every breach, the mode and why the mode did not apply.
    both = pod({"name": "c", "image": "docker.io/x:1"})
    out = _apply_mode(check(both, WARN), WARN)
    assert not out.allowed and out.rule_ids == ["capability-drop", "registry"]
    assert "(warn)" in out.message and "['capability-drop'] hold in every mode" in out.message
    assert "drop ALL" in out.message


DEDICATED = parse_policy_text("""
apiVersion: sandman.dev/v1alpha1
kind: SandboxPolicy
rules:
- name: nodes
  profiles:
    rollout: {}
    eval:
      nodeSelector: {sandman.dev/dedicated: eval}
      tolerations: [{key: sandman.dev/dedicated, operator: Equal, value: eval, effect: NoSchedule}]
""").rules[0]


def test_an_eval_sandbox_that_lost_its_placement_is_refused_and_told_what_it_lacks() -> None:
    p = pod({**sc(drop=["NET_RAW"]), "image": "i"})
    p["metadata"]["annotations"]["sandman.dev/profile"] = "eval"
    p["spec"]["tolerations"] = [dict(DEDICATED.profiles["eval"].tolerations[0])]
    [v] = check(p, DEDICATED)
    assert v.rule == "dedicated-nodes"
    assert "lacks nodeSelector {'sandman.dev/dedicated': 'eval'}" in v.message
    assert "tolerations" not in v.message.split("lacks", 1)[1]
    p["spec"]["nodeSelector"] = {"sandman.dev/dedicated": "eval", "zone": "a"}
    assert check(p, DEDICATED) == []  # narrowing further is the user's business
