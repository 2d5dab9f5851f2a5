"""The shared server plumbing: --listen parsing for every component."""

from __future__ import annotations

import argparse
from types import ModuleType
from typing import Any

import pytest

from sandman.extender import config as extender_config
from sandman.reaper import config as reaper_config
from sandman.serving import add_listen_flag, parse_listen
from sandman.webhook import config as webhook_config


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("127.0.0.1:8443", ("127.0.0.1", 8443)),
        (":8080", ("0.0.0.0", 8080)),  # empty host: the default's
        ("[::1]:7000", ("::1", 7000)),
        ("localhost:0", ("localhost", 0)),  # port 0: any free port
    ],
)
def test_parse_listen(value: str, want: tuple[str, int]) -> None:
    assert parse_listen(value, "0.0.0.0") == want


@pytest.mark.parametrize("value", ["8080", "host:", "host:http", "host:65536", "host:-1"])
def test_bad_listen_is_a_usage_error_naming_the_flag(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    p = argparse.ArgumentParser()
    add_listen_flag(p, "127.0.0.1:1", "HOST:PORT")
    with pytest.raises(SystemExit) as e:
        p.parse_args([f"--listen={value}"])
    assert e.value.code == 2
    assert f"--listen: wants HOST:PORT, got {value!r}" in capsys.readouterr().err


def _config(module: ModuleType, argv: list[str]) -> Any:
    p = argparse.ArgumentParser()
    module.add_flags(p)
    return module.from_args(p.parse_args(argv))


@pytest.mark.parametrize(
    ("module", "extra", "default"),
    [
        (webhook_config, ["--daemon-image=127.0.0.1:5000/d:1"], ("0.0.0.0", 8443)),
        (reaper_config, [], ("0.0.0.0", 8080)),
        (extender_config, [], ("127.0.0.1", 8890)),
    ],
)
def test_each_component_takes_listen_the_same_way(
    module: ModuleType, extra: list[str], default: tuple[str, int]
) -> None:
    c = _config(module, extra)
    assert (c.host, c.port) == default
    c = _config(module, [*extra, "--listen=:9999"])
    assert (c.host, c.port) == (default[0], 9999)
    c = _config(module, [*extra, "--listen=10.0.0.1:1234"])
    assert (c.host, c.port) == ("10.0.0.1", 1234)
