"""Shell completion: the engine (commands, verbs, flags, choices; the cluster
look-ups are in tests/integration/test_cli_kubectl.py), and the bash and zsh
scripts sourced into the real shells."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sandman.cli.completion import DEFAULT, NO_FILES, complete
from sandman.cli.main import COMMANDS

# Every command that starts with "po" (pool, port-forward, policy, ...).
PO = sorted(c for c in COMMANDS if c.startswith("po"))
assert {"pool", "port-forward"} <= set(PO)


def test_commands_and_pool_verbs() -> None:
    assert complete(["po"]) == (PO, NO_FILES)
    assert complete(["pool", ""]) == (["create", "delete", "ls", "scale"], NO_FILES)
    assert complete(["pool", "l"]) == (["ls"], NO_FILES)


def test_flags_and_their_choices_come_from_the_parsers() -> None:
    flags, d = complete(["exec", "--"])
    assert {"--kubeconfig", "--context", "--namespace", "--detach", "--stdin"} <= set(flags)
    assert d == NO_FILES
    assert complete(["ls", "-o", ""]) == (["json", "name", "wide", "yaml"], NO_FILES)
    assert complete(["pool", "ls", "--output", "y"]) == (["yaml"], NO_FILES)
    assert complete(["run", "--transport", "d"]) == (["direct"], NO_FILES)
    assert complete(["completion", ""]) == (["bash", "zsh"], NO_FILES)


def test_files_where_files_belong() -> None:
    assert complete(["exec", "pod", "--", "ca"]) == ([], DEFAULT)  # the sandbox's command
    assert complete(["cp", "./lo"]) == ([], DEFAULT)  # a local path
    assert complete(["exec", "--kubeconfig", "~/.ku"]) == ([], DEFAULT)


# -- the scripts, sourced into the real shells ---------------------------------------------
BIN = Path(sys.executable).parent


def shell(program: str, script: str) -> list[str]:
    out = subprocess.run(
        [program, "-c", script],
        env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": "/nonexistent"},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return out.stdout.split()


def bash(*words: str) -> list[str]:
    return shell("bash", (
        "source <(sandman completion bash)\n"
        f"COMP_WORDS=(sandman {shlex.join(words)}); COMP_CWORD={len(words)}\n"
        '_sandman_complete; printf "%s\\n" "${COMPREPLY[@]}"\n'
    ))  # fmt: skip


def zsh(*words: str) -> list[str]:
    # zsh's completion system stubbed where it meets the script: compdef at
    # source time, compadd/_files to see what the function offers.
    return shell("zsh", (
        "compdef() { :; }\n"
        'compadd() { shift; print -l -- "$@"; }\n'
        "_files() { print FILES; }\n"
        "source <(sandman completion zsh)\n"
        f"words=(sandman {shlex.join(words)}); CURRENT={len(words) + 1}\n"
        "_sandman\n"
    ))  # fmt: skip


@pytest.mark.parametrize("complete_in", [bash, zsh], ids=["bash", "zsh"])
def test_the_scripts_complete_through_the_engine(complete_in: Callable[..., list[str]]) -> None:
    assert complete_in("po") == PO
    assert complete_in("ls", "-o", "") == ["json", "name", "wide", "yaml"]
    assert complete_in("pool", "s") == ["scale"]


def test_the_scripts_fall_back_to_files() -> None:
    assert zsh("exec", "pod", "--", "ca") == ["FILES"]
    files = bash("cp", "/et")
    assert files == ["/etc"]
