"""reset-capabilities: what the denial says (the corpus holds the cases:
tests/corpus/admission/reset_capabilities.yaml)."""

from __future__ import annotations

from typing import Any

from sandman.contract import LABEL_SANDBOX
from sandman.webhook.checks import check
from sandman.webhook.policy import parse_policy_text

RULES = parse_policy_text("""
apiVersion: sandman.dev/v1alpha1
kind: SandboxPolicy
rules:
- name: debugging
  allowedCapabilities: [SYS_PTRACE]
  profiles:
    rollout: {}
    eval: {reuse: false}
""").rules[0]


def pod(profile: str | None, caps: list[str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "labels": {LABEL_SANDBOX: "true"},
            "annotations": {"sandman.dev/profile": profile} if profile else {},
        },
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": "i",
                    # NET_RAW dropped, as the mutating webhook leaves it.
                    "securityContext": {"capabilities": {"add": caps, "drop": ["NET_RAW"]}},
                }
            ],
        },
    }


def test_the_denial_names_the_capability_the_profile_and_both_fixes() -> None:
    [v] = check(pod(None, ["CAP_SYS_PTRACE"]), RULES)
    assert v.rule == "reset-capabilities"
    assert "['SYS_PTRACE']" in v.message and "'rollout'" in v.message
    assert "drop ['SYS_PTRACE']" in v.fix and "reuse: false" in v.fix


def test_one_breach_one_rule_and_never_reset_profiles_are_free() -> None:
    # Not granted at all: the capabilities rule's alone.
    assert [v.rule for v in check(pod(None, ["SYS_TIME"]), RULES)] == ["capabilities"]
    assert check(pod("eval", ["SYS_PTRACE"]), RULES) == []
