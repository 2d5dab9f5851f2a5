"""The contract's parsers: every value is either read as the contract means it or
refused with a ContractError that says how to fix it (never another exception)."""

from __future__ import annotations

import datetime as dt

import pytest

from sandman.contract import (
    MAX_DURATION,
    ContractError,
    format_duration,
    format_time,
    parse_duration,
    parse_time,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90m", 5400), ("1h30m", 5400), ("45s", 45), ("2d", 172800), ("1.5h", 5400), ("250ms", 0.25)],
)
def test_durations_read_as_go_reads_them(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize(
    "text",
    [
        "99999999999d",  # OverflowError in timedelta before the bound existed
        "1" + "0" * 50 + "s",
        "3651d",  # just past the bound
        "87601h",
    ],
)
def test_huge_durations_are_refused_with_the_bound(text: str) -> None:
    with pytest.raises(ContractError, match="at most 3650d"):
        parse_duration(text, field="sandman.dev/ttl")


def test_the_bound_itself_is_accepted_and_formats_back() -> None:
    assert parse_duration("3650d") == MAX_DURATION
    assert format_duration(MAX_DURATION) == "3650d"


@pytest.mark.parametrize(
    "value",
    [
        "",
        " ",
        "0s",
        "-5m",
        "5",
        "m",
        "5 m",
        "1e3s",
        "\u0669\u0660m",  # Arabic-Indic digits: \d would take them, the contract does not
        "\uff19\uff10m",  # full-width digits
        "90m\u200b",  # zero-width space
        "nan" + "s",
        "1" + "0" * 400 + "s",  # float('inf') seconds before the length bound
        "inf" + "s",
        None,
        90,
        ["90m"],
    ],
)
def test_non_durations_are_refused_clearly(value: object) -> None:
    with pytest.raises(ContractError, match=r"sandman\.dev/ttl"):
        parse_duration(value, field="sandman.dev/ttl")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value",
    [
        "0001-01-01T00:00:00+14:00",  # before year 1 in UTC: OverflowError before the fix
        "9999-12-31T23:59:59-14:00",  # after year 9999 in UTC
        "2026-11-30",  # no time zone
        "2026-11-30T12:00:00",  # no time zone
        "tomorrow",
        "",
        None,
        1700000000,
    ],
)
def test_bad_times_are_refused_clearly(value: object) -> None:
    with pytest.raises(ContractError, match=r"sandman\.dev/expires-at"):
        parse_time(value, field="sandman.dev/expires-at")  # type: ignore[arg-type]


def test_times_are_read_in_utc_and_format_back() -> None:
    t = parse_time("2026-11-30T13:00:00+01:00")
    assert t == dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
    assert format_time(t) == "2026-11-30T12:00:00Z"
