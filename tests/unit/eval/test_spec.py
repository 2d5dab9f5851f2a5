"""Spec parsing: the YAML and JSON-lines forms, defaults, aliases, and refusals."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from sandman.eval.spec import DEFAULT_RESOURCES, DEFAULT_TIMEOUT, SpecError, parse_spec

ROOT = Path(__file__).resolve().parents[3]

YAML = b"""
name: demo
defaults:
  image: 127.0.0.1:5000/sandman/swe:1
  workdir: /work/repo
  timeout: 90s
  resources: {cpu: 250m}
tasks:
  - id: fix
    apply:
      patch: |
        --- a/x
        +++ b/x
    test:
      command: python3 -m unittest -v
      fail_to_pass: [tests.test_ops.OpsTest.test_mean]
      pass_to_pass: [tests.test_ops.OpsTest.test_add]
  - id: exit
    image: 127.0.0.1:5000/sandman/tiny:1
    workdir: null
    setup: ["echo a", [touch, /tmp/b]]
    apply: {command: "echo 42 > /tmp/answer"}
    test: {commands: ["test -e /tmp/b", [sh, -c, "exit 0"]]}
    network: true
    env: {MY_VAR: x}
    timeout: 5
"""


def test_yaml_spec_with_defaults() -> None:
    spec = parse_spec(YAML, name="file-stem", jsonl=False)
    assert spec.name == "demo" and spec.digest.startswith("sha256:")
    fix, ex = spec.tasks
    assert fix.image.endswith("swe:1") and fix.workdir == "/work/repo"
    assert fix.timeout == dt.timedelta(seconds=90)
    # cpu from defaults, memory from the built-in default
    assert dict(fix.resources) == {"cpu": "250m", "memory": DEFAULT_RESOURCES["memory"]}
    assert fix.apply.kind == "patch" and fix.test.scoring == "tests"
    assert fix.test.fail_to_pass == ("tests.test_ops.OpsTest.test_mean",)
    assert fix.network is False
    assert ex.workdir is None and ex.timeout == dt.timedelta(seconds=5)
    assert ex.setup == ("echo a", ("touch", "/tmp/b"))
    assert ex.apply.kind == "command" and ex.test.scoring == "exit_code"
    assert ex.test.commands == ("test -e /tmp/b", ("sh", "-c", "exit 0"))
    assert ex.network is True and dict(ex.env) == {"MY_VAR": "x"}


def test_jsonl_spec_takes_swe_bench_names() -> None:
    line = {
        "instance_id": "calc__calc-1",
        "image": "127.0.0.1:5000/sandman/swe:1",
        "model_patch": "--- a/x\n+++ b/x\n",
        "FAIL_TO_PASS": json.dumps(["t.a"]),  # SWE-bench stores the lists as JSON text
        "PASS_TO_PASS": ["t.b"],
        "test": {"command": "python3 -m unittest -v"},
    }
    spec = parse_spec((json.dumps(line) + "\n\n").encode(), name="swe", jsonl=True)
    (t,) = spec.tasks
    assert t.id == "calc__calc-1" and t.apply.patch == "--- a/x\n+++ b/x\n"
    assert t.test.fail_to_pass == ("t.a",) and t.test.pass_to_pass == ("t.b",)
    assert t.test.scoring == "tests" and t.timeout == DEFAULT_TIMEOUT


def test_the_bundled_example_parses() -> None:
    path = ROOT / "examples" / "eval" / "calc.yaml"
    spec = parse_spec(path.read_bytes(), name=path.stem, jsonl=False)
    assert len(spec.tasks) >= 4


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (b"tasks: []", "no tasks"),
        (b"tasks: [{id: a, image: x:1, test: {command: t}, tset: 1}]", "unknown field 'tset'"),
        (b"tasks: [{id: a, image: x:1}]", "no test"),
        (b"tasks: [{id: a/b, image: x:1, test: {command: t}}]", "must be letters"),
        (b"tasks: [{id: ../a, image: x:1, test: {command: t}}]", "must be letters"),
        (b"tasks: [{id: a, image: 'X Y', test: {command: t}}]", "task a.image"),
        (
            b"tasks: [{id: a, image: x:1, test: {command: t}},"
            b" {id: a, image: x:1, test: {command: t}}]",
            "appears twice",
        ),
        (b"tasks: [{id: a, id: b, image: x:1, test: {command: t}}]", "key 'id' appears twice"),
        (b"tasks: [{id: a, image: x:1, test: {command: t}, timeout: 2y}]", "not a duration"),
        (b"tasks: [{id: a, image: x:1, test: {command: t}, timeout: 25h}]", "at most 24h"),
        (b"tasks: [{id: a, image: x:1, test: {command: t}, timeout: 1e30}]", "timeout"),
        (b"tasks: [{id: a, image: x:1, test: {command: t}, timeout: .nan}]", "timeout"),
        (
            b"tasks: [{id: a, image: x:1, test: {command: t}, resources: {cpu: lots}}]",
            "not a quantity",
        ),
        (
            b"tasks: [{id: a, image: x:1, test: {command: t}, resources: {gpu: 1}}]",
            "unknown field 'gpu'",
        ),
        (
            b"tasks: [{id: a, image: x:1, test: {command: t}, env: {TZ: Asia/Tokyo}}]",
            "fixed by the runner",
        ),
        (b"tasks: [{id: a, image: x:1, test: {command: t}, network: 'yes'}]", "expected a boolean"),
        (b"tasks: [{id: a, image: x:1, test: {command: t, commands: [t]}}]", "one of them"),
        (b"tasks: [{id: a, image: x:1, test: {command: t, scoring: tests}}]", "needs fail_to_pass"),
        (
            b"tasks: [{id: a, image: x:1,"
            b" test: {command: t, scoring: exit_code, pass_to_pass: [x]}}]",
            "only read with scoring: tests",
        ),
        (
            b"tasks: [{id: a, image: x:1, test: {command: t, pass_to_pass: [x], format: junit}}]",
            "format",
        ),
        (
            b"tasks: [{id: a, image: x:1, test: {command: t}, apply: {patch: p, command: c}}]",
            "exactly one",
        ),
        (
            b"tasks: [{id: a, image: x:1, test: {command: t}, apply: {patch: p}, patch: q}]",
            "give the patch once",
        ),
        (b"tasks: [{id: a, image: x:1, test: {command: ''}}]", "expected a command"),
        (
            b"tasks: [{id: a, image: x:1, test: {command: t}, pod_command: sleep}]",
            "list of strings",
        ),
        (b"- a\n- b\n", "expected a mapping"),
        (b"tasks: [a: b", "not YAML"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_bad_specs_are_refused_with_where(text: bytes, error: str) -> None:
    with pytest.raises(SpecError, match=error):
        parse_spec(text, name="t", jsonl=False)


def test_bad_jsonl_names_the_line() -> None:
    with pytest.raises(SpecError, match="line 2: not JSON"):
        parse_spec(b'{"id": "a", "image": "x:1", "test": {"command": "t"}}\n{oops\n',
                   name="t", jsonl=True)  # fmt: skip


def test_digest_changes_with_the_bytes() -> None:
    a = parse_spec(YAML, name="t", jsonl=False)
    b = parse_spec(YAML + b"\n# a comment\n", name="t", jsonl=False)
    assert a.tasks == b.tasks and a.digest != b.digest
