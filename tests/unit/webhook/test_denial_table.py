"""docs/policy.md's denial table lists exactly the rule ids the webhook can deny with.

The ids are read from the webhook's source, so a rule added anywhere (a check,
an UPDATE rule, a review-level refusal, a MutationError) without its row, or a
row left behind after a rule went, fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sandman.webhook.checks import CHECKS
from sandman.webhook.updates import HARD_RULES

ROOT = Path(__file__).resolve().parents[3]
RULE_ID = re.compile(r"[a-z][a-z-]*")


def documented() -> set[str]:
    doc = (ROOT / "docs" / "policy.md").read_text()
    table = doc.split("| rule id |", 1)[1].split("\n\n")[0]
    return set(
        re.findall(r"`([a-z][a-z-]*)`", "\n".join(r.split("|")[1] for r in table.splitlines()[2:]))
    )


def _literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if RULE_ID.fullmatch(node.value) else None
    return None


def emitted() -> set[str]:
    """Rule ids as the source spells them: ``Violation("id", ...)``,
    ``MutationError(..., rule="id")`` (default ``contract``), ``rule_ids=["id"]``,
    plus the ids of the check table (some are built from a prefix there)."""
    out = {rid for ids, _f in CHECKS for rid in ids} | {"contract"}
    for path in sorted((ROOT / "webhook").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name == "Violation" and node.args and (rid := _literal(node.args[0])):
                out.add(rid)
            for kw in node.keywords:
                if kw.arg == "rule" and name == "MutationError" and (rid := _literal(kw.value)):
                    out.add(rid)
                if kw.arg == "rule_ids" and isinstance(kw.value, ast.List):
                    out |= {rid for e in kw.value.elts if (rid := _literal(e))}
    return out


def test_every_rule_id_the_webhook_emits_has_a_row() -> None:
    assert emitted() - documented() == set()


def test_every_row_names_a_rule_the_webhook_emits() -> None:
    assert documented() - emitted() == set()


def test_rules_enforced_in_every_mode_say_so() -> None:
    doc = (ROOT / "docs" / "policy.md").read_text()
    rows = [r for r in doc.split("| rule id |", 1)[1].split("\n\n")[0].splitlines()[2:]]
    for rid in HARD_RULES:
        row = next(r for r in rows if f"`{rid}`" in r.split("|")[1])
        assert "every mode" in row, row
