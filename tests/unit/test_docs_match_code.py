"""Every name the user documentation mentions exists in the code.

README.md and docs/**/*.md name metrics (``sandman_*``), CLI flags (in
``sandman ...`` command lines and in flag tables), policy keys (in policy
YAML examples and where prose calls a camelCase name a policy field) and
labels/annotations (``sandman.dev/...``). A doc that names something the code
does not have sends a user to a dead end, and nothing else catches it: the
docs are read, never run. Each mismatch is reported as ``file:line: name``.

What counts as "exists":

- a metric: a string in the product's Python (or the shipped monitoring
  manifests) equal to the name, or to its stem for the suffixes Prometheus
  adds (a counter created as ``x`` is exposed as ``x_total``; histograms add
  ``_bucket``/``_sum``/``_count``). ``sandman_daemon_*`` (a prefix) must
  start some name.
- a flag: an option of the real argparse parser that ``sandman.cli.main``
  builds for that command, subcommands included (``sandman pool create``
  resolves against ``pool create``'s parser). A flag table resolves against
  every subcommand of the command the section last showed.
- a policy key: a key the webhook's strict policy parser reads
  (``webhook/policy.py``; unknown keys make it refuse the file).
- a label or annotation: a ``sandman.dev/...`` string in the product's Python
  (constants like ``PREFIX + "ttl"`` included) or its manifests.
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_DIRS = ("sandman", "webhook", "daemon", "extender", "reaper", "bench", "harness")
CLI_COMMAND = re.compile(
    # `sandman CMD`, `kubectl sandman CMD`, `.venv/bin/sandman CMD`; not
    # `sandmand`, `sandman.client`, `sandman-k8s` or `sandman_x`.
    r"(?<![\w.-])(?:[\w.~/-]*/)?(?:kubectl[ -])?sandman[ \t]+(?=[a-z])"
)
METRIC = re.compile(r"(?<![\w.])sandman_[a-z0-9_]+")
SANDMAN_NAME = re.compile(r"sandman\.dev/[A-Za-z0-9][A-Za-z0-9._/-]*")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
HEADING = re.compile(r"^#{1,6}\s")
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
# Prose that calls an inline camelCase name a policy field.
POLICY_CONTEXT = re.compile(
    r"(policy(?: rule)?(?: file)?(?:'s)? (?:field|key)s?|rule's|rule field|"
    r"policy's|policy rule field|field)\s*$",
    re.I,
)
CAMEL = re.compile(r"^([a-z]+[A-Z][A-Za-z]*(?:\.[a-z][A-Za-z]*)*)(?::\s*\S.*)?$")


@dataclass(frozen=True)
class Line:
    path: str  # relative to the repo root
    number: int
    text: str
    fence: str | None  # the code fence's language ("" if none given), None for prose


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def doc_lines(path: Path) -> list[Line]:
    out: list[Line] = []
    fence: str | None = None
    rel = str(path.relative_to(ROOT))
    for n, text in enumerate(path.read_text().splitlines(), 1):
        m = FENCE.match(text)
        if m:
            fence = None if fence is not None else m.group(2)
            continue
        out.append(Line(rel, n, text, fence))
    return out


def all_lines() -> list[Line]:
    return [line for p in doc_files() for line in doc_lines(p)]


# -- what the code has ---------------------------------------------------------------
def _product_files(*exts: str) -> Iterator[Path]:
    for d in PRODUCT_DIRS:
        for ext in exts:
            yield from (ROOT / d).rglob(f"*{ext}")


@functools.cache
def _python_strings() -> tuple[str, ...]:
    """Every string constant of the product's Python, with ``PREFIX + "x"``
    concatenations of sandman.contract's PREFIX resolved."""
    return tuple(_strings_of(_product_files(".py")))


def _strings_of(paths: Iterator[Path]) -> Iterator[str]:
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
                v = node.value
                yield v.decode("utf-8", "replace") if isinstance(v, bytes) else v
            elif (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Add)
                and isinstance(node.right, ast.Constant)
                and isinstance(node.right.value, str)
                and (
                    (isinstance(node.left, ast.Name) and node.left.id == "PREFIX")
                    or (isinstance(node.left, ast.Attribute) and node.left.attr == "PREFIX")
                )
            ):
                yield "sandman.dev/" + node.right.value


def _manifest_texts() -> Iterator[str]:
    for ext in (".yaml", ".json"):
        for p in (ROOT / "manifests").rglob(f"*{ext}"):
            yield p.read_text()


@functools.cache
def code_metric_names() -> frozenset[str]:
    names: set[str] = set()
    for s in _python_strings():
        names.update(METRIC.findall(s))
    for text in _manifest_texts():
        names.update(METRIC.findall(text))
    return frozenset(names)


PROM_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def metric_exists(name: str, code: frozenset[str]) -> bool:
    if name.endswith("_"):  # a prefix: sandman_daemon_*
        return any(c.startswith(name) for c in code)
    if name in code:
        return True
    for suffix in PROM_SUFFIXES:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            if stem in code or (suffix != "_total" and stem + "_total" in code):
                return True
            if stem.endswith("_seconds") and stem in code:
                return True
    return False


def code_sandman_names() -> set[str]:
    names: set[str] = set()
    for s in _python_strings():
        names.update(SANDMAN_NAME.findall(s))
    for text in _manifest_texts():
        names.update(SANDMAN_NAME.findall(text))
    return {n.rstrip(".-/") for n in names}


def policy_keys() -> set[str]:
    """The keys the webhook's policy parser reads: it asks for every key it
    knows at each level whether or not the file has it (``Fields.raw``), so
    parsing one rule with every nested mapping present records them all."""
    from sandman.webhook import policy, policy_fields

    seen: set[str] = set()
    original = policy_fields.Fields.raw

    def raw(self: Any, key: str) -> Any:
        seen.add(key)
        return original(self, key)

    doc = {
        "apiVersion": "sandman.dev/v1alpha1",
        "kind": "SandboxPolicy",
        "rules": [
            {
                "name": "all",
                "namespaceSelector": {
                    "matchLabels": {"zz": "zz"},
                    "matchExpressions": [{"key": "zz", "operator": "Exists"}],
                },
                "resources": {"defaults": {"requests": {"cpu": "1"}}, "max": {"cpu": "2"}},
                "ttl": {"default": "1h"},
                "idleTimeout": {"default": "1h"},
                "profiles": {
                    "zz": {"tolerations": [{"key": "zz", "operator": "Exists"}]},
                },
            }
        ],
    }
    policy_fields.Fields.raw = raw  # type: ignore[method-assign]
    try:
        policy.parse_policy(doc)
    finally:
        policy_fields.Fields.raw = original  # type: ignore[method-assign]
    return seen - {"zz"}  # the probe's own profile name


# Policy mappings whose keys are the user's (profile names, label keys,
# resource names), not the parser's.
FREE_KEYS = {"profiles", "matchLabels", "nodeSelector", "requests", "limits", "max", "metadata"}


def policy_doc_keys(doc: Any) -> Iterator[str]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield str(k)
            if k == "profiles" and isinstance(v, dict):
                for prof in v.values():
                    yield from policy_doc_keys(prof)
            elif k not in FREE_KEYS:
                yield from policy_doc_keys(v)
    elif isinstance(doc, list):
        for item in doc:
            yield from policy_doc_keys(item)


# -- the CLI -----------------------------------------------------------------------
def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


class Cli:
    """The real parsers of every `sandman` command, built on demand."""

    def __init__(self) -> None:
        from sandman.cli.main import COMMANDS

        self.commands = set(COMMANDS)
        self._cache: dict[str, argparse.ArgumentParser] = {}

    def top(self) -> argparse.ArgumentParser:
        from sandman.cli.main import build_parser

        return build_parser(None)

    def command(self, name: str) -> argparse.ArgumentParser:
        if name not in self._cache:
            from sandman.cli.main import build_parser

            self._cache[name] = _subparsers(build_parser(name))[name]
        return self._cache[name]

    def all_options(self, p: argparse.ArgumentParser) -> set[str]:
        opts = set(p._option_string_actions)
        for child in _subparsers(p).values():
            opts |= self.all_options(child)
        return opts


def has_option(p: argparse.ArgumentParser | set[str], flag: str) -> bool:
    opts = p if isinstance(p, set) else set(p._option_string_actions)
    if flag in opts:
        return True
    # -it: single-letter flags bundled, as argparse (and kubectl) accept them.
    if re.fullmatch(r"-[A-Za-z]{2,}", flag):
        return all(f"-{ch}" in opts for ch in flag[1:])
    return False


SHELL_STOP = {"|", "||", "&", "&&", ";", ")", "(", ">", ">>", "<", "2>", "2>&1", "--"}


def _words(text: str) -> list[str]:
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.commenters = "#"
    lex.whitespace_split = True
    try:
        return list(lex)
    except ValueError:  # an unbalanced quote: a line cut in the middle
        return text.split()


def command_words(text: str) -> list[str]:
    """The words of one `sandman ...` command, up to what ends it in a shell."""
    out = []
    for w in _words(text):
        if w in SHELL_STOP or w.startswith(("|", ";", "&", ")", "`", ">")):
            break
        out.append(w)
    return out


def flag_of(word: str) -> str | None:
    w = word.strip("[]{}()<>,")
    if not w.startswith("-") or w in ("-", "--") or re.match(r"-\d", w):
        return None
    w = w.split("=", 1)[0]
    if not re.fullmatch(r"--?[A-Za-z][A-Za-z0-9-]*", w):
        return None
    return w


def check_command(cli: Cli, words: list[str], strict: bool) -> tuple[str, list[str]]:
    """(the command's name as resolved, its flags missing from its parser)."""
    top = cli.top()
    positional = [w for w in words if not w.startswith("-") and not w.startswith("[")]
    known = [w for w in positional if w in cli.commands]
    if not known:
        first = words[0] if words else ""
        if strict and re.fullmatch(r"[a-z][a-z0-9-]*", first):
            return first, [f"(no command `sandman {first}`)"]
        return "", []
    # `kubectl sandman -n NS exec ...`: options (and their values) may come first
    name = known[0]
    positional = positional[positional.index(name) :]
    parser = cli.command(name)
    chain: list[argparse.ArgumentParser | set[str]] = [top, parser]
    path = [name]
    for w in positional[1:]:
        subs = _subparsers(parser)
        if w in subs:
            parser = subs[w]
            chain.append(parser)
            path.append(w)
        elif subs and strict and re.fullmatch(r"[a-z][a-z0-9-]*", w):
            return " ".join(path), [f"(no subcommand `{w}`)"]
        else:
            if subs and re.fullmatch(r"[A-Z][A-Z0-9_]*", w):
                # `sandman bench NAME --json F`: a placeholder for any subcommand
                chain.append(cli.all_options(parser))
            break
    missing = []
    for w in words:
        flag = flag_of(w)
        if flag and not any(has_option(p, flag) for p in chain):
            missing.append(flag)
    return " ".join(path), missing


def commands_in(line: Line) -> Iterator[tuple[str, bool]]:
    """(command text after `sandman `, strict) for each `sandman` command the
    line shows: in code blocks anywhere (a `sandman` at a command's start is
    strict: an unknown command is an error), in prose inside inline code."""
    sources = [line.text] if line.fence is not None else INLINE_CODE.findall(line.text)
    for src in sources:
        for m in CLI_COMMAND.finditer(src):
            before = src[: m.start()].rstrip()
            strict = before in ("", "$") or before.endswith(("$(", "`", "&&", ";", "|"))
            yield src[m.end() :], strict and (line.fence is not None or before == "")


def joined(lines: list[Line]) -> Iterator[Line]:
    """Lines of code blocks with shell continuations (`\\`) joined."""
    buf: Line | None = None
    for line in lines:
        if buf is not None:
            line = Line(buf.path, buf.number, buf.text[:-1] + " " + line.text.strip(), line.fence)
            buf = None
        if line.fence is not None and line.text.rstrip().endswith("\\"):
            buf = Line(line.path, line.number, line.text.rstrip(), line.fence)
            continue
        yield line


# -- the checks ----------------------------------------------------------------------
def test_every_metric_the_docs_name_is_exported() -> None:
    code = code_metric_names()
    missing = [
        f"{line.path}:{line.number}: {name}"
        for line in all_lines()
        for name in METRIC.findall(line.text)
        if not metric_exists(name, code)
    ]
    assert not missing, "metrics the docs name that no code exports:\n" + "\n".join(missing)


def test_every_sandman_dev_label_and_annotation_the_docs_name_exists() -> None:
    code = code_sandman_names()
    missing = []
    for line in all_lines():
        for name in SANDMAN_NAME.findall(line.text):
            name = name.rstrip(".-/")
            if name.endswith("*") or name == "sandman.dev":
                continue
            if name not in code:
                missing.append(f"{line.path}:{line.number}: {name}")
    assert not missing, "sandman.dev/ names the docs use that the code does not:\n" + "\n".join(
        missing
    )


def test_every_flag_in_a_documented_sandman_command_exists() -> None:
    cli = Cli()
    missing = []
    for path in doc_files():
        for line in joined(doc_lines(path)):
            for text, strict in commands_in(line):
                name, bad = check_command(cli, command_words(text), strict)
                missing += [f"{line.path}:{line.number}: sandman {name} {b}" for b in bad]
    assert not missing, "flags the docs give that the CLI does not take:\n" + "\n".join(missing)


def test_every_flag_in_a_flag_table_exists() -> None:
    """Tables whose first column heads "flag": each `--flag` in that column is
    an option of the command the section last showed (any of its
    subcommands), or of some command if the section showed none; so is a flag
    that heads a table's first column."""
    cli = Cli()
    missing = []
    for path in doc_files():
        context: str | None = None
        in_table = False
        for line in joined(doc_lines(path)):
            if line.fence is None and HEADING.match(line.text):
                context = None  # a new section: its own commands
            for text, _strict in commands_in(line):
                words = command_words(text)
                if words and words[0] in cli.commands:
                    context = words[0]
            if line.fence is not None:
                continue
            cells = [c.strip() for c in line.text.strip().strip("|").split("|")]
            if not line.text.lstrip().startswith("|"):
                in_table = False
                continue
            header = not in_table
            if header:
                # a table of flags, or one whose first column heads with a
                # flag (`--delivery` | what sandboxes get): that flag is checked
                in_table = cells[0].lower() in ("flag", "flags", "option", "options")
                if in_table or not re.fullmatch(r"`--?[A-Za-z][\w-]*`", cells[0]):
                    continue
            opts = (
                cli.all_options(cli.command(context))
                if context
                else set().union(*(cli.all_options(cli.command(c)) for c in cli.commands))
            )
            for span in INLINE_CODE.findall(cells[0]):
                for w in span.split():
                    flag = flag_of(w)
                    if flag and not has_option(opts, flag):
                        missing.append(f"{line.path}:{line.number}: sandman {context} {flag}")
    assert not missing, "flags in flag tables that the CLI does not take:\n" + "\n".join(missing)


def _policy_yaml_blocks(path: Path) -> Iterator[tuple[int, str]]:
    start, block, lang = 0, [], None
    rel_lines = path.read_text().splitlines()
    for n, text in enumerate(rel_lines, 1):
        m = FENCE.match(text)
        if m and lang is None:
            lang, start, block = m.group(2), n + 1, []
        elif m:
            if lang in ("yaml", "yml"):
                yield start, "\n".join(block)
            lang = None
        elif lang is not None:
            block.append(text)


def _policy_docs(text: str) -> Iterator[Any]:
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError:
        return
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        if doc.get("kind") == "SandboxPolicy" or (
            "rules" in doc and "kind" not in doc and isinstance(doc["rules"], list)
        ):
            yield doc
        elif doc.get("kind") == "ConfigMap":
            for v in (doc.get("data") or {}).values():
                if isinstance(v, str):
                    yield from _policy_docs(v)


def test_every_policy_key_the_docs_use_is_read_by_the_policy_parser() -> None:
    known = policy_keys()
    missing = []
    for path in doc_files():
        rel = str(path.relative_to(ROOT))
        for start, block in _policy_yaml_blocks(path):
            for doc in _policy_docs(block):
                for key in policy_doc_keys(doc):
                    if key not in known:
                        line = next(
                            (start + i for i, t in enumerate(block.splitlines()) if key in t),
                            start,
                        )
                        missing.append(f"{rel}:{line}: {key}")
        for line in doc_lines(path):
            if line.fence is not None:
                continue
            for m in INLINE_CODE.finditer(line.text):
                km = CAMEL.match(m.group(1).strip())
                if not km or not POLICY_CONTEXT.search(line.text[: m.start()]):
                    continue
                for key in km.group(1).split("."):
                    if key not in known:
                        missing.append(f"{line.path}:{line.number}: {key}")
    assert not missing, "policy keys the docs use that the policy parser refuses:\n" + "\n".join(
        missing
    )


# -- the checker checks itself on worked examples ------------------------------------------
@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("sandman_reaper_reclaimed_total", True),  # created with _total
        ("sandman_pool_creates_total", True),  # created as sandman_pool_creates
        ("sandman_webhook_admission_duration_seconds_bucket", True),
        ("sandman_daemon_", True),  # the prefix of sandman_daemon_*
        ("sandman_webhook_policy_errors", False),  # a counter is exposed as _total only
        ("sandman_reaper_api_requests", False),
        ("sandman_no_such_metric", False),
    ],
)
def test_metric_resolution(name: str, ok: bool) -> None:
    assert metric_exists(name, code_metric_names()) is ok


@pytest.mark.parametrize(
    ("command", "missing"),
    [
        ("pool create web --image IMG --size 4", []),
        ("pool create web --no-such-flag", ["--no-such-flag"]),
        ("exec -i POD -- sh -c 'x --not-ours'", []),  # after `--`: the user's command
        ("eval run spec.yaml -n default -o out --resume", []),
        ("ls -o wide | grep x --color", []),  # after a pipe: another program
        ("cluster up [--real-node] [--kwok-nodes N]", []),
        ("-n team-a exec POD -- true", []),  # kubectl's habit: options first
        ("bench NAME --json F", []),  # a placeholder for any benchmark
        ("fleet --k 2", ["--k"]),  # `--k` is `fleet run`'s, not `fleet`'s
    ],
)
def test_command_resolution(command: str, missing: list[str]) -> None:
    assert check_command(Cli(), command_words(command), strict=True)[1] == missing


def test_policy_keys_are_the_parsers() -> None:
    known = policy_keys()
    assert {"allowedRegistries", "daemonDelivery", "guaranteedQoS", "tolerations"} <= known
    assert "allowedRegistry" not in known
