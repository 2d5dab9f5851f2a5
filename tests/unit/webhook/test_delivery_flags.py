"""The webhook's daemon delivery flags (--daemon-delivery, --daemon-shared-dir)."""

from __future__ import annotations

import argparse

import pytest

from sandman.webhook import config as cfg


def parse(*argv: str) -> cfg.WebhookConfig:
    p = argparse.ArgumentParser()
    cfg.add_flags(p)
    return cfg.from_args(p.parse_args(["--daemon-image", "r/d:1", *argv]))


def test_copy_is_the_default_delivery() -> None:
    c = parse()
    assert (c.daemon_delivery, c.daemon_shared_dir) == ("copy", "/var/lib/sandman/daemon")


def test_shared_delivery_and_its_node_directory() -> None:
    c = parse("--daemon-delivery", "shared", "--daemon-shared-dir", "/srv/sandman/")
    assert (c.daemon_delivery, c.daemon_shared_dir) == ("shared", "/srv/sandman")


@pytest.mark.parametrize(
    "argv",
    [
        ("--daemon-delivery", "hostpath"),
        ("--daemon-shared-dir", "relative/dir"),
        ("--daemon-shared-dir", "/"),
        ("--daemon-shared-dir", "/var/../etc"),
    ],
)
def test_bad_values_are_refused(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)
    assert "--daemon-" in capsys.readouterr().err


def test_the_node_delivery_as_the_default_needs_the_node_installer() -> None:
    with pytest.raises(SystemExit, match="--node-installer"):
        parse("--daemon-delivery", "node")
    c = parse("--daemon-delivery", "node", "--node-installer")
    assert (c.daemon_delivery, c.node_installer) == ("node", True)
    assert parse().node_installer is False
