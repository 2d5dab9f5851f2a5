"""Every duration flag of the CLI takes the same forms (sandman/cli/durations.py)."""

from __future__ import annotations

import argparse

import pytest

from sandman.cli import durations
from sandman.cli.durations import lease_text, parse_seconds
from sandman.cli.main import build_parser
from sandman.contract import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),  # plain seconds, what the old float flags took
        ("1.5", 1.5),
        (" 90s ", 90.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1m0s", 60.0),
        ("2d", 172800.0),
        ("1.5h", 5400.0),
    ],
)
def test_the_forms_every_flag_takes(text: str, seconds: float) -> None:
    assert parse_seconds(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("abc", "is not a duration; use e.g. 90, 90s, 5m, 1h30m, 500ms, 2d"),
        ("5x", "is not a duration"),
        ("-5", "is not a duration"),
        ("1h 30m", "is not a duration"),
        ("", "empty"),
        ("0", "must be more than zero"),
        ("0s", "must be more than zero"),
        ("3651d", "out of range; use at most 3650d"),
    ],
)
def test_what_no_flag_takes(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_seconds(text)


def test_a_wait_may_be_zero() -> None:
    assert parse_seconds("0", zero_ok=True) == 0.0
    assert parse_seconds("0s", zero_ok=True) == 0.0


def test_a_lease_is_annotation_text_the_webhook_reads() -> None:
    assert lease_text("90") == "90s"
    assert lease_text("1h30m") == "1h30m"
    for text in ("90", "2.5", "5m", "1h30m", "500ms"):
        assert parse_duration(lease_text(text)).total_seconds() == parse_seconds(text)


def test_a_bad_value_is_a_usage_error_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser("run").parse_args(["run", "img", "--timeout", "soon"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --timeout: 'soon' is not a duration; use e.g. 90" in err


# (command line, the attribute, what it must be): each duration flag of the CLI.
FLAGS = [
    (["run", "img", "--ttl", "90"], "ttl", "90s"),
    (["run", "img", "--idle-timeout", "5m"], "idle_timeout", "5m"),
    (["run", "img", "--timeout", "1h30m"], "timeout", 5400.0),
    (["exec", "pod", "--timeout", "90s"], "timeout", 90.0),
    (["extend", "pod", "600"], "duration", "600s"),
    (["claim", "p", "--ttl", "90"], "ttl", "90s"),
    (["claim", "p", "--wait", "0"], "wait", 0.0),
    (["claim", "p", "--timeout", "2m"], "timeout", 120.0),
    (["pool", "create", "p", "--image", "i", "--ttl", "1h"], "ttl", "1h"),
    (["fleet", "run", "img", "--ttl", "1800"], "ttl", "1800s"),
    (["fleet", "run", "img", "--timeout", "10m"], "timeout", 600.0),
    (["fleet", "run", "img", "--api-wait", "2m"], "api_wait", 120.0),
    (["e2b-gateway", "--startup-timeout", "5m"], "startup_timeout", 300.0),
    (["eval", "run", "spec.yaml", "--start-timeout", "5m"], "start_timeout", 300.0),
]


@pytest.mark.parametrize(("argv", "attr", "want"), FLAGS, ids=[" ".join(f[0]) for f in FLAGS])
def test_every_duration_flag_uses_the_one_parser(argv: list[str], attr: str, want: object) -> None:
    args = build_parser(argv[0]).parse_args(argv)
    assert getattr(args, attr) == want


def test_the_argparse_types_map_errors_to_usage_errors() -> None:
    for fn in (durations.seconds, durations.seconds_or_zero, durations.lease):
        with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
            fn("soon")
