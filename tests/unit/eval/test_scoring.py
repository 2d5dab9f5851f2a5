"""Reading test outcomes from output, and SWE-bench's resolved rule."""

from __future__ import annotations

from sandman.eval.scoring import (
    FAILED,
    PASSED,
    SKIPPED,
    CommandResult,
    parse_lines,
    parse_pytest,
    parse_unittest,
    score,
)
from sandman.eval.spec import Grading

UNITTEST_311 = """\
test_add (tests.test_ops.OpsTest.test_add) ... ok
test_mean (tests.test_ops.OpsTest.test_mean) ... FAIL
test_doc (tests.test_ops.OpsTest.test_doc)
The mean of nothing is an error. ... ERROR
test_skip (tests.test_ops.OpsTest.test_skip) ... skipped 'not today'
test_x (tests.test_ops.OpsTest.test_x) ... expected failure
test_y (tests.test_ops.OpsTest.test_y) ... unexpected success

======================================================================
FAIL: test_mean (tests.test_ops.OpsTest.test_mean)
"""
UNITTEST_310 = "test_add (tests.test_ops.OpsTest) ... ok\n"
PYTEST = """\
tests/test_ops.py::test_add PASSED                                       [ 50%]
tests/test_ops.py::test_mean FAILED                                      [100%]
=========================== short test summary info ============================
PASSED tests/test_ops.py::test_add
FAILED tests/test_ops.py::test_mean - AssertionError: assert 2.0 == 2.5
XFAIL tests/test_ops.py::test_old - reason
SKIPPED [1] tests/test_ops.py:12: no db
"""


def test_unittest_verbose_output() -> None:
    got = parse_unittest(UNITTEST_311)
    assert got == {
        "tests.test_ops.OpsTest.test_add": PASSED,
        "tests.test_ops.OpsTest.test_mean": FAILED,
        "tests.test_ops.OpsTest.test_doc": FAILED,  # the docstring form: result on the next line
        "tests.test_ops.OpsTest.test_skip": SKIPPED,
        "tests.test_ops.OpsTest.test_x": PASSED,
        "tests.test_ops.OpsTest.test_y": FAILED,
    }
    # Python 3.10 and older print the class only; the name comes out the same.
    assert parse_unittest(UNITTEST_310) == {"tests.test_ops.OpsTest.test_add": PASSED}


def test_pytest_summary_and_verbose_lines() -> None:
    got = parse_pytest(PYTEST)
    assert got["tests/test_ops.py::test_add"] == PASSED
    assert got["tests/test_ops.py::test_mean"] == FAILED
    assert got["tests/test_ops.py::test_old"] == PASSED
    assert len(got) == 3  # the SKIPPED [1] location line names no test id


def test_a_test_seen_failing_once_failed() -> None:
    assert parse_lines("PASS a\nFAIL a\nPASS a\nOK b\nSKIP c\n") == {
        "a": FAILED,
        "b": PASSED,
        "c": SKIPPED,
    }


MEAN, ADD = "tests.test_ops.OpsTest.test_mean", "tests.test_ops.OpsTest.test_add"
T = Grading(("python3 -m unittest -v",), "tests", "unittest", (MEAN,), (ADD,))


def run(out: str, code: int = 1, timed_out: bool = False) -> list[CommandResult]:
    return [CommandResult(code, timed_out, out)]


def test_resolved_needs_every_named_test_passing() -> None:
    fixed = "test_add (tests.test_ops.OpsTest.test_add) ... ok\n" \
            "test_mean (tests.test_ops.OpsTest.test_mean) ... ok\n"  # fmt: skip
    v = score(T, run(fixed, 0))
    assert v.passed and v.reason == "tests_passed"
    v = score(T, run(UNITTEST_311))
    assert not v.passed and v.detail["not_passed"] == ["tests.test_ops.OpsTest.test_mean"]
    # A suite that crashed before a named test: that test is missing, not passed.
    v = score(T, run("test_add (tests.test_ops.OpsTest.test_add) ... ok\n", 0))
    assert not v.passed and v.detail["fail_to_pass"] == {
        "tests.test_ops.OpsTest.test_mean": "missing"
    }


def test_exit_codes_and_timeouts() -> None:
    t = Grading(("a", "b"))
    assert score(t, [CommandResult(0, False, ""), CommandResult(0, False, "")]).passed
    v = score(t, [CommandResult(0, False, ""), CommandResult(3, False, "")])
    assert not v.passed and v.reason == "exit_code" and v.detail["exit_codes"] == [0, 3]
    v = score(T, run("test_mean (tests.test_ops.OpsTest.test_mean) ... ok\n", -9, True))
    assert not v.passed and v.reason == "timeout"
