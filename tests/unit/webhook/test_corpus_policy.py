"""The policy corpus (tests/corpus/policy): every hostile policy file is refused
with a message naming what is wrong; every accepted one means what it says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sandman.webhook.policy import PolicyError, parse_policy_text
from sandman.webhook.policy_source import Load, PolicySource

CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "policy"


def _cases() -> list[Any]:
    out = []
    for path in sorted(CORPUS.glob("*.yaml")):
        for case in yaml.safe_load(path.read_text())["cases"]:
            out.append(pytest.param(case, id=f"{path.stem}: {case['name']}"))
    return out


@pytest.mark.parametrize("case", _cases())
def test_policy_case(case: dict[str, Any]) -> None:
    assert ("rejected" in case) != ("accepted" in case), "a case says one of the two"
    if "rejected" in case:
        with pytest.raises(PolicyError) as e:
            parse_policy_text(case["text"])
        assert case["rejected"] in str(e.value)
        # And the webhook keeps its last good policy.
        src = PolicySource()
        assert src.load_text("rules: [{name: good}]", "good") is Load.LOADED
        assert src.load_text(case["text"], "corpus") is Load.REJECTED
        assert [r.name for r in src.current().rules] == ["good"] and src.errors == 1
        return
    want = case["accepted"] or {}
    rule = parse_policy_text(case["text"]).select(want.get("select") or {})
    if "rule" in want:
        assert rule.name == want["rule"]
    for attr, value in (want.get("fields") or {}).items():
        got = getattr(rule, attr)
        assert (list(got) if isinstance(got, tuple) else got) == value, attr


def test_the_documented_example_and_the_shipped_policies_parse() -> None:
    root = Path(__file__).resolve().parents[3]
    doc = (root / "docs" / "policy.md").read_text()
    blocks = [b.split("```", 1)[0] for b in doc.split("```yaml\n")[1:]]
    example = next(b for b in blocks if "kind: SandboxPolicy" in b)
    assert parse_policy_text(example).rules[0].name == "research"
    shipped = yaml.safe_load((root / "manifests" / "webhook" / "policy.yaml").read_text())
    assert parse_policy_text(shipped["data"]["policy.yaml"]).rules[0].name == "default"
    from sandman.harness.cluster.deploy import LOCAL_POLICY

    assert parse_policy_text(LOCAL_POLICY).rules[0].name == "local-default"


def test_a_policy_larger_than_a_configmap_is_refused() -> None:
    with pytest.raises(PolicyError, match="larger than"):
        parse_policy_text("rules: []\n" + "#" * (1 << 20))
