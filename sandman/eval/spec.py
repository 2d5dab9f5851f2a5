"""An evaluation spec: the tasks of a benchmark, parsed strictly (pure).

A spec is YAML (``defaults`` + ``tasks``) or JSON lines (one task per line,
SWE-bench's ``instance_id``/``model_patch``/``FAIL_TO_PASS``/``PASS_TO_PASS``
accepted as aliases). docs/eval.md has the format. A score is only worth
something when everybody reads the spec the same way, so it is read the way
the policy file is: unknown keys, wrong types and duplicated keys are refused
with the task and field they are in, never guessed around.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from sandman.eval import fields
from sandman.eval.fields import SpecError
from sandman.oci import InvalidReference, Reference
from sandman.quantity import parse_quantity

# Task ids name directories of the results: printable, no path separators.
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
# A benchmark's task finishes in minutes (SWE-bench's harness allows 30 min
# per instance); 10 minutes is the default and 24 h the most we accept.
DEFAULT_TIMEOUT = dt.timedelta(minutes=10)
# What a task's sandbox gets when the spec says nothing: one core and 1 GiB,
# as requests = limits (Guaranteed QoS). SWE-bench images run their test
# suites in that; bigger tasks say so in `resources`.
DEFAULT_RESOURCES = {"cpu": "1", "memory": "1Gi"}
SCORINGS = ("exit_code", "tests")
FORMATS = ("unittest", "pytest", "lines")
# The fixed environment (conditions.FIXED_ENV) may not be changed by a task.
RESERVED_ENV = frozenset({"PYTHONHASHSEED", "TZ", "LANG", "LC_ALL"})
# JSON lines of SWE-bench style datasets: their names for our fields.
ALIASES = {"instance_id": "id", "model_patch": "patch"}
TASK_KEYS = frozenset(
    {"id", "image", "workdir", "setup", "apply", "test", "timeout", "resources", "env",
     "network", "pod_command", "patch", "FAIL_TO_PASS", "PASS_TO_PASS"}
)  # fmt: skip


@dataclass(frozen=True)
class Apply:
    """The agent's output: exactly one of a patch, files, a command (or nothing)."""

    patch: str | None = None
    files: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] | str | None = None

    @property
    def kind(self) -> str:
        if self.patch is not None:
            return "patch"
        if self.files:
            return "files"
        return "command" if self.command is not None else "none"


@dataclass(frozen=True)
class Grading:
    commands: tuple[tuple[str, ...] | str, ...]
    scoring: str = "exit_code"  # exit_code | tests
    format: str = "unittest"  # how named tests are read from the output
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()


@dataclass(frozen=True)
class Task:
    id: str
    image: str
    test: Grading
    workdir: str | None = None
    setup: tuple[tuple[str, ...] | str, ...] = ()
    apply: Apply = field(default_factory=Apply)
    timeout: dt.timedelta = DEFAULT_TIMEOUT
    resources: tuple[tuple[str, str], ...] = tuple(sorted(DEFAULT_RESOURCES.items()))
    env: tuple[tuple[str, str], ...] = ()
    network: bool = False
    pod_command: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Spec:
    name: str
    tasks: tuple[Task, ...]
    digest: str  # sha256 of the spec's bytes: a resumed run must run the same spec

    def task(self, task_id: str) -> Task:
        return next(t for t in self.tasks if t.id == task_id)


def _resources(v: Any, where: str) -> tuple[tuple[str, str], ...]:
    m = fields.mapping(v, where, frozenset({"cpu", "memory"}))
    out = dict(DEFAULT_RESOURCES)
    for k, q in m.items():
        text = (
            str(q)
            if isinstance(q, int | float) and not isinstance(q, bool)
            else fields.text(q, f"{where}.{k}")
        )
        try:
            if parse_quantity(text) <= 0:
                raise ValueError(f"{text!r} must be positive")
        except ValueError as e:
            raise SpecError(f"{where}.{k}: {e}") from None
        out[k] = text
    return tuple(sorted(out.items()))


def _env(v: Any, where: str) -> tuple[tuple[str, str], ...]:
    m = fields.mapping(v, where)
    for k, val in m.items():
        if not isinstance(k, str) or not ENV_NAME_RE.fullmatch(k):
            raise SpecError(f"{where}: {k!r} is not an environment variable name")
        if k in RESERVED_ENV:
            raise SpecError(f"{where}.{k}: fixed by the runner for every task (docs/eval.md)")
        fields.text(val, f"{where}.{k}")
    return tuple(sorted(m.items()))


def _apply(v: Any, where: str, patch_alias: Any) -> Apply:
    if v is None and patch_alias is None:
        return Apply()
    if v is not None and patch_alias is not None:
        raise SpecError(f"{where}: give the patch once (apply.patch or patch)")
    m = (
        {"patch": patch_alias}
        if v is None
        else fields.mapping(v, where, frozenset({"patch", "files", "command"}))
    )
    if len(m) != 1:
        raise SpecError(f"{where}: give exactly one of patch, files, command")
    if "patch" in m:
        return Apply(patch=fields.text(m["patch"], f"{where}.patch"))
    if "command" in m:
        return Apply(command=fields.command(m["command"], f"{where}.command"))
    files = fields.mapping(m["files"], f"{where}.files")
    if not files:
        raise SpecError(f"{where}.files: empty")
    for path, text in files.items():
        if not isinstance(path, str) or not path or "\0" in path:
            raise SpecError(f"{where}.files: {path!r} is not a path")
        fields.text(text, f"{where}.files[{path!r}]")
    return Apply(files=tuple(sorted(files.items())))


def _test(v: Any, where: str, f2p: Any, p2p: Any) -> Grading:
    keys = frozenset({"command", "commands", "scoring", "format", "fail_to_pass", "pass_to_pass"})
    m = dict(fields.mapping(v, where, keys))
    for alias, name in ((f2p, "fail_to_pass"), (p2p, "pass_to_pass")):
        if alias is not None:
            if name in m:
                raise SpecError(f"{where}: {name} given twice (and as {name.upper()})")
            m[name] = alias
    if ("command" in m) == ("commands" in m):
        raise SpecError(f"{where}: give command or commands (one of them)")
    commands = fields.commands(m.get("command", m.get("commands")), f"{where}.command")
    if not commands:
        raise SpecError(f"{where}.commands: empty")
    f2p_names = (
        fields.names(m["fail_to_pass"], f"{where}.fail_to_pass") if "fail_to_pass" in m else ()
    )
    p2p_names = (
        fields.names(m["pass_to_pass"], f"{where}.pass_to_pass") if "pass_to_pass" in m else ()
    )
    scoring = m.get("scoring", "tests" if f2p_names or p2p_names else "exit_code")
    if scoring not in SCORINGS:
        raise SpecError(f"{where}.scoring: {scoring!r} is not one of {', '.join(SCORINGS)}")
    if scoring == "tests" and not (f2p_names or p2p_names):
        raise SpecError(f"{where}: scoring by tests needs fail_to_pass and/or pass_to_pass")
    if scoring == "exit_code" and (f2p_names or p2p_names):
        raise SpecError(f"{where}: named tests are only read with scoring: tests")
    fmt = m.get("format", "unittest")
    if fmt not in FORMATS:
        raise SpecError(f"{where}.format: {fmt!r} is not one of {', '.join(FORMATS)}")
    return Grading(commands, scoring, fmt, f2p_names, p2p_names)


def parse_task(raw: Any, defaults: Mapping[str, Any], where: str) -> Task:
    m = (
        {ALIASES.get(k, k): v for k, v in fields.mapping(raw, where).items()}
        if isinstance(raw, dict)
        else raw
    )
    m = {**defaults, **fields.mapping(m, where, TASK_KEYS)}
    task_id = fields.text(m.get("id"), f"{where}.id")
    if not ID_RE.fullmatch(task_id):
        raise SpecError(f"{where}.id: {task_id!r} must be letters, digits, '.', '_' or '-'")
    where = f"task {task_id}"
    image = fields.text(m.get("image"), f"{where}.image")
    try:
        Reference.parse(image)
    except InvalidReference as e:
        raise SpecError(f"{where}.image: {e}") from None
    if "test" not in m:
        raise SpecError(f"{where}: no test (what decides the score)")
    workdir = (
        fields.text(m["workdir"], f"{where}.workdir") if m.get("workdir") is not None else None
    )
    pod_cmd = m.get("pod_command")
    if pod_cmd is not None and not (
        isinstance(pod_cmd, list) and pod_cmd and all(isinstance(a, str) for a in pod_cmd)
    ):
        raise SpecError(f"{where}.pod_command: expected a list of strings")
    network = m.get("network", False)
    if not isinstance(network, bool):
        raise SpecError(f"{where}.network: expected a boolean, got {fields.kind(network)}")
    return Task(
        id=task_id,
        image=image,
        test=_test(m["test"], f"{where}.test", m.get("FAIL_TO_PASS"), m.get("PASS_TO_PASS")),
        workdir=workdir,
        setup=fields.commands(m["setup"], f"{where}.setup") if "setup" in m else (),
        apply=_apply(m.get("apply"), f"{where}.apply", m.get("patch")),
        timeout=fields.timeout(m["timeout"], f"{where}.timeout")
        if "timeout" in m
        else DEFAULT_TIMEOUT,
        resources=_resources(m.get("resources") or {}, f"{where}.resources"),
        env=_env(m.get("env") or {}, f"{where}.env"),
        network=network,
        pod_command=tuple(pod_cmd) if pod_cmd is not None else None,
    )


def _check_unique(tasks: list[Task]) -> tuple[Task, ...]:
    seen: set[str] = set()
    for t in tasks:
        if t.id in seen:
            raise SpecError(f"task id {t.id!r} appears twice")
        seen.add(t.id)
    if not tasks:
        raise SpecError("the spec has no tasks")
    return tuple(tasks)


def parse_spec(data: bytes, *, name: str, jsonl: bool) -> Spec:
    """A spec from its bytes (``jsonl``: one task per line, else YAML)."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise SpecError("the spec is not UTF-8 text") from None
    if jsonl:
        tasks = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    raw = json.loads(line)
                except ValueError as e:
                    raise SpecError(f"line {n}: not JSON ({e})") from None
                tasks.append(parse_task(raw, {}, f"line {n}"))
        return Spec(name, _check_unique(tasks), digest)
    try:
        doc = yaml.load(text, Loader=fields.Loader)  # a SafeLoader
    except yaml.YAMLError as e:
        raise SpecError(f"not YAML: {e}") from None
    doc = fields.mapping(
        doc, "the spec", frozenset({"apiVersion", "kind", "name", "defaults", "tasks"})
    )
    defaults = {
        ALIASES.get(k, k): v
        for k, v in fields.mapping(doc.get("defaults") or {}, "defaults").items()
    }
    fields.mapping(defaults, "defaults", TASK_KEYS - {"id"})
    raw_tasks = doc.get("tasks")
    if not isinstance(raw_tasks, list):
        raise SpecError("tasks: expected a list of tasks")
    tasks = [parse_task(t, defaults, f"tasks[{i}]") for i, t in enumerate(raw_tasks)]
    return Spec(str(doc.get("name") or name), _check_unique(tasks), digest)
