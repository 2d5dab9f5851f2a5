"""What each `sandman image` command needs, decided before it starts building."""

from __future__ import annotations

import pytest

from sandman.harness.images import needs as n
from sandman.harness.images.build import IMAGE_NAMES


def _whats(needs: list[n.Need]) -> set[str]:
    return {x.what for x in needs}


def test_every_image_has_an_entry() -> None:
    # A new image without an entry would start building and fail halfway.
    assert set(IMAGE_NAMES) <= set(n.IMAGE_NEEDS)


def test_the_daemon_needs_debians_python_and_pip_not_go_nor_skopeo() -> None:
    got = _whats(n.command_needs("build", ["daemon"]))
    assert got == {"/usr/bin/python3.11", "ldd", "py:pip"}


def test_the_scheduler_needs_go() -> None:
    assert _whats(n.command_needs("build", ["scheduler"])) == {"go"}


def test_push_and_export_add_skopeo() -> None:
    for command in ("push", "export"):
        assert "skopeo" in _whats(n.command_needs(command, ["daemon"]))
    assert "skopeo" not in _whats(n.command_needs("build", ["daemon"]))


def test_the_dev_version_needs_every_component() -> None:
    # `--version dev` hashes every component's layers, the scheduler's Go build too.
    got = _whats(n.command_needs("build", ["daemon"], version="dev"))
    assert "go" in got
    assert "deb:libpython3.11-stdlib" in got


def test_each_need_is_listed_once() -> None:
    got = n.command_needs("push", ["controller", "daemon", "scheduler", "coredns"])
    assert len(got) == len(set(got))


def test_missing_keeps_the_order_and_the_report_says_how() -> None:
    needs = n.command_needs("push", ["controller", "daemon", "scheduler"])
    absent_names = {"skopeo", "go", "deb:libssl3", "deb:zlib1g"}
    absent = n.missing(needs, lambda x: x.what not in absent_names)
    assert [x.what for x in absent] == ["deb:libssl3", "deb:zlib1g", "go", "skopeo"]
    text = n.report("push", absent)
    assert text.startswith("`sandman image push` cannot run here: missing")
    assert "- skopeo: " in text and "apt-get install skopeo" in text
    assert "- go: " in text and "https://go.dev/dl/" in text
    # The Debian packages on one line, one apt-get for all.
    assert "apt-get install libssl3 zlib1g" in text
    assert "Prerequisites" in text


def test_nothing_missing_is_no_report() -> None:
    needs = n.command_needs("build", ["daemon"])
    assert n.missing(needs, lambda _x: True) == []


@pytest.mark.parametrize(
    ("what", "label"),
    [("deb:libssl3", "the Debian package libssl3"), ("py:pip", "pip (in this Python)"),
     ("skopeo", "skopeo")],
)  # fmt: skip
def test_labels(what: str, label: str) -> None:
    assert n.Need(what, "how", "why").label == label


def test_the_probe_answers_for_this_machine(tmp_path) -> None:  # type: ignore[no-untyped-def]
    present = n.probe([])
    assert present(n.Need(str(tmp_path), "", ""))
    assert not present(n.Need(str(tmp_path / "absent"), "", ""))
    assert present(n.Need("py:json", "", ""))
    assert not present(n.Need("py:no_such_module_here", "", ""))
    assert not present(n.Need("no-such-command-here", "", ""))


def test_another_architecture_needs_debians_packages_for_it() -> None:
    got = _whats(n.command_needs("push", ["daemon"], foreign=True))
    assert {"gpgv", "/usr/share/keyrings/debian-archive-keyring.gpg", "dpkg-deb"} <= got
    # Test images are built for this machine only: no foreign needs.
    assert "gpgv" not in _whats(n.command_needs("build", ["tiny"], foreign=True))
    assert "gpgv" not in _whats(n.command_needs("push", ["daemon"]))
