"""The completion engine (cluster look-ups aside): commands, verbs, flags, choices."""

from __future__ import annotations

from sandman.cli.completion import DEFAULT, NO_FILES, complete


def test_commands_and_pool_verbs() -> None:
    assert complete(["po"]) == (["pool", "port-forward"], NO_FILES)
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
