"""kubectl's JSONPath, the part people type (sandman/cli/jsonpath.py), and `-o jsonpath=`."""

from __future__ import annotations

import io
import json

import pytest

from sandman.cli import jsonpath
from sandman.cli.jsonpath import JsonPathError, render
from sandman.cli.main import build_parser
from sandman.cli.output import Column, emit, emit_one

POD = {
    "metadata": {
        "name": "sb-a",
        "labels": {"sandman.dev/pool": "web", "app": "x"},
        "annotations": {"sandman.dev/ttl": "30m"},
    },
    "spec": {"containers": [{"name": "sandbox", "image": "python:3.11"}, {"name": "side"}]},
    "status": {
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False"},
        ],
        "podIP": "10.0.0.7",
        "restarts": 2,
        "ready": False,
    },
}
LIST = {"kind": "List", "items": [POD, {"metadata": {"name": "sb-b"}, "status": {"podIP": None}}]}


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ("{.metadata.name}", "sb-a"),
        ("{.metadata.labels.app}", "x"),
        ("{.metadata.labels['sandman.dev/pool']}", "web"),
        ('{.metadata.labels["sandman.dev/pool"]}', "web"),
        ("{.spec.containers[*].name}", "sandbox side"),
        ("{.spec.containers[0].image}", "python:3.11"),
        ("{.spec.containers[-1].name}", "side"),
        ("{.spec.containers[0:1].name}", "sandbox"),
        ('{.status.conditions[?(@.type=="Ready")].status}', "False"),
        ("{.status.conditions[?(@.type!='Ready')].type}", "PodScheduled"),
        ("{.status.restarts}", "2"),
        ("{.status.ready}", "false"),
        ("{.metadata.annotations}", '{"sandman.dev/ttl":"30m"}'),
        ("{.metadata.nope}", ""),  # missing: nothing, as kubectl by default
        ("{..image}", "python:3.11"),
        ("{$.metadata.name}", "sb-a"),
        ("name={.metadata.name} ip={.status.podIP}", "name=sb-a ip=10.0.0.7"),
        ('{.metadata.name}{"\\n"}', "sb-a\n"),
        ("{'\\t'}", "\t"),
    ],
)
def test_one_object(template: str, want: str) -> None:
    assert render(template, POD) == want


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ("{.items[*].metadata.name}", "sb-a sb-b"),
        ('{range .items[*]}{.metadata.name}{"\\n"}{end}', "sb-a\nsb-b\n"),
        ("{range .items}{.metadata.name},{end}", "sb-a,sb-b,"),
        (
            "{range .items[*]}{.metadata.name}:"
            '{range .spec.containers[*]} {.name}{end}{"\\n"}{end}',
            "sb-a: sandbox side\nsb-b:\n",
        ),
        ("{.items[*].status.podIP}", "10.0.0.7 "),  # a null prints as nothing
        ("{.items[?(@.status.podIP)].metadata.name}", "sb-a"),
    ],
)
def test_lists_and_ranges(template: str, want: str) -> None:
    assert render(template, LIST) == want


@pytest.mark.parametrize(
    "template",
    ["{.a", "{.a}}", "{range .items[*]}{.a}", "{end}", "{.a[x]}", "{.a[?(@.b==nope)]}", "{.}a{.["],
)
def test_bad_templates_are_refused(template: str) -> None:
    with pytest.raises(JsonPathError):
        jsonpath.parse(template)


def test_o_jsonpath_on_a_listing_sees_kubectls_list() -> None:
    out = io.StringIO()
    rows = [{"name": "sb-a", "state": "Ready"}, {"name": "sb-b", "state": "Pending"}]
    emit(rows, [Column("NAME", "name")], "jsonpath={.items[*].name}", kind="pod", out=out)
    assert out.getvalue() == "sb-a sb-b"


def test_o_jsonpath_on_one_object() -> None:
    out = io.StringIO()
    assert emit_one({"name": "sb-a", "ip": "10.0.0.7"}, "jsonpath={.ip}", kind="pod", out=out)
    assert out.getvalue() == "10.0.0.7"
    out = io.StringIO()
    assert emit_one({"name": "sb-a"}, "json", kind="pod", out=out)
    assert json.loads(out.getvalue()) == {"name": "sb-a"}
    assert not emit_one({"name": "sb-a"}, None, kind="pod")


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "-o", "jsonpath={.items[*].name}"],
        ["ls", "-o=jsonpath={.items[*].name}"],
        ["ls", "--output=jsonpath='{.items[*].name}'"],
        ["ps", "pod", "-o", "jsonpath={.items[*].id}"],
        ["pool", "ls", "-o", "jsonpath={.items[*].name}"],
        ["run", "img", "-o", "jsonpath={.name}"],
        ["claim", "p", "-o", "jsonpath={.name}"],
    ],
)
def test_every_output_flag_takes_jsonpath(argv: list[str]) -> None:
    args = build_parser(argv[0]).parse_args(argv)
    assert args.output.startswith("jsonpath={.items[*].") or args.output == "jsonpath={.name}"


def test_the_named_formats_still_parse_and_a_bad_template_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for fmt in ("json", "yaml", "name", "wide"):
        assert build_parser("ls").parse_args(["ls", "-o", fmt]).output == fmt
    with pytest.raises(SystemExit) as e:
        build_parser("ls").parse_args(["ls", "-o", "jsonpath={.items[*].name"])
    assert e.value.code == 2 and "bad jsonpath template" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        build_parser("run").parse_args(["run", "img", "-o", "wide"])
    assert e.value.code == 2
