"""From a task's test output to its score (pure).

Two ways to score, as benchmarks do: the test commands' exit codes, or named
tests read from their output, SWE-bench's rule: every FAIL_TO_PASS test (the
ones the fix must make pass) and every PASS_TO_PASS test (the ones it must
not break) passed. A named test that does not appear in the output did not
pass: a suite that crashed before reaching it must not count as a fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sandman.eval.spec import Grading

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
# Status words of each runner, and what they mean for a score.
_UNITTEST = {
    "ok": PASSED,
    "expected failure": PASSED,
    "FAIL": FAILED,
    "ERROR": FAILED,
    "unexpected success": FAILED,
}
_PYTEST = {
    "PASSED": PASSED,
    "XFAIL": PASSED,
    "FAILED": FAILED,
    "ERROR": FAILED,
    "XPASS": FAILED,
    "SKIPPED": SKIPPED,
}
_LINES = {"PASS": PASSED, "OK": PASSED, "FAIL": FAILED, "ERROR": FAILED, "SKIP": SKIPPED}

# `test_x (pkg.mod.Class.test_x) ... ok` (3.11+) or `test_x (pkg.mod.Class) ... ok`;
# a test with a docstring prints the name line, then `first line ... ok`.
_UT_NAME = re.compile(r"^(\w+) \(([\w.]+)\)")
_UT_RESULT = re.compile(r" \.\.\. (ok|FAIL|ERROR|expected failure|unexpected success|skipped\b.*)$")
# `PASSED tests/a.py::test_x` (-rA summary) or `tests/a.py::test_x PASSED [ 50%]` (-v).
_PT_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S+::\S+)")
_PT_VERBOSE = re.compile(r"^(\S+::\S+)\s+(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\b")
_LINE = re.compile(r"^(PASS|OK|FAIL|ERROR|SKIP)[:\s]\s*(\S.*?)\s*$")


def _merge(out: dict[str, str], name: str, status: str) -> None:
    """A test seen twice (summary and verbose line, or run twice) failed if either did."""
    if out.get(name) != FAILED:
        out[name] = status


def _unittest_name(method: str, where: str) -> str:
    return where if where.endswith("." + method) else f"{where}.{method}"


def parse_unittest(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pending: str | None = None
    for line in text.splitlines():
        name = _UT_NAME.match(line)
        if name:
            pending = _unittest_name(name.group(1), name.group(2))
        result = _UT_RESULT.search(line)
        if result and pending is not None:
            word = result.group(1)
            _merge(out, pending, SKIPPED if word.startswith("skipped") else _UNITTEST[word])
            pending = None
    return out


def parse_pytest(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _PT_SUMMARY.match(line)
        if m:
            _merge(out, m.group(2), _PYTEST[m.group(1)])
            continue
        m = _PT_VERBOSE.match(line)
        if m:
            _merge(out, m.group(1), _PYTEST[m.group(2)])
    return out


def parse_lines(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            _merge(out, m.group(2), _LINES[m.group(1)])
    return out


PARSERS = {"unittest": parse_unittest, "pytest": parse_pytest, "lines": parse_lines}


@dataclass(frozen=True)
class CommandResult:
    """What a test command did (the part scoring needs)."""

    exit_code: int
    timed_out: bool
    output: str  # stdout then stderr


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str  # tests_passed | tests_failed | exit_code | timeout
    detail: dict[str, Any] = field(default_factory=dict)


def _named(names: Iterable[str], seen: Mapping[str, str]) -> dict[str, str]:
    return {n: seen.get(n, "missing") for n in names}


def score(test: Grading, results: list[CommandResult]) -> Verdict:
    """The verdict on a task whose test commands ran (``results`` in order)."""
    if any(r.timed_out for r in results):
        return Verdict(False, "timeout", {"exit_codes": [r.exit_code for r in results]})
    codes = [r.exit_code for r in results]
    if test.scoring == "exit_code":
        ok = all(c == 0 for c in codes)
        return Verdict(ok, "exit_code_zero" if ok else "exit_code", {"exit_codes": codes})
    seen = PARSERS[test.format]("\n".join(r.output for r in results))
    f2p, p2p = _named(test.fail_to_pass, seen), _named(test.pass_to_pass, seen)
    not_passed = sorted(n for n, s in {**f2p, **p2p}.items() if s != PASSED)
    detail = {"fail_to_pass": f2p, "pass_to_pass": p2p, "exit_codes": codes}
    if not_passed:
        detail["not_passed"] = not_passed
    return Verdict(not not_passed, "tests_passed" if not not_passed else "tests_failed", detail)
