"""`-o` formats: one helper for every listing, kubectl's table layout and names."""

from __future__ import annotations

import io
import json

import pytest
import yaml

from sandman.cli.output import Column, duration, emit, strip_kind, table

ROWS = [
    {"name": "sb-1", "age_s": 75, "ip": "10.0.0.9", "note": None},
    {"name": "a-much-longer-name", "age_s": 4000, "ip": None, "note": "x"},
]
COLUMNS = [
    Column("NAME", "name"),
    Column("AGE", "age_s", show=duration),
    Column("IP", "ip", wide=True),
]


def out(fmt: str | None, kind: str = "pod") -> str:
    buf = io.StringIO()
    emit(ROWS, COLUMNS, fmt, kind=kind, out=buf)
    return buf.getvalue()


def test_table_is_kubectl_like_and_wide_adds_columns() -> None:
    assert out(None) == (
        "NAME                 AGE\nsb-1                 1m15s\na-much-longer-name   1h06m\n"
    )
    assert out("wide").splitlines() == [
        "NAME                 AGE     IP",
        "sb-1                 1m15s   10.0.0.9",
        "a-much-longer-name   1h06m   <none>",
    ]


def test_json_and_yaml_are_the_rows_unchanged_and_name_is_kind_slash_name() -> None:
    assert json.loads(out("json")) == ROWS
    assert yaml.safe_load(out("yaml")) == ROWS
    assert out("name") == "pod/sb-1\npod/a-much-longer-name\n"
    assert out("name", kind="pool") == "pool/sb-1\npool/a-much-longer-name\n"


@pytest.mark.parametrize(
    ("given", "kinds", "want"),
    [
        ("pod/x", ("pod", "pods"), "x"),
        ("pods/x", ("pod", "pods"), "x"),
        ("x", ("pod",), "x"),
        ("pool/x", ("pod",), "pool/x"),  # another kind: left for the API to refuse
    ],
)
def test_names_printed_by_o_name_are_taken_back(
    given: str, kinds: tuple[str, ...], want: str
) -> None:
    assert strip_kind(given, *kinds) == want


def test_durations_and_empty_tables() -> None:
    assert [duration(s) for s in (None, 0, 59, 60, 3599, 3600, 90061, -30)] == [
        "<none>", "0s", "59s", "1m00s", "59m59s", "1h00m", "1d1h", "-30s",
    ]  # fmt: skip
    assert table(["A", "BB"], []) == "A   BB\n"
