"""`sandman fleet`: result lines, problems files, and re-rendering a saved run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sandman.cli.common import UsageError
from sandman.cli.fleet import problems_of, result_line
from sandman.cli.main import main
from sandman.fleet.records import Attempt, Outcome, RolloutRecord, RunData, SandboxSpan, Source
from sandman.fleet.report import summarize, write_json


def test_a_result_line_is_one_json_object() -> None:
    rec = RolloutRecord("p1", 2, Outcome.OK, 1.0,
                        [Attempt(Source.CREATED, "sb-1", 1.0, t_acquired=2.5)])  # fmt: skip
    assert json.loads(result_line(rec)) == {
        "problem": "p1", "rollout": 2, "outcome": "ok", "reward": 1.0, "attempts": 1,
        "sandbox": "sb-1", "ttfc_s": 1.5,
    }  # fmt: skip
    failed = RolloutRecord("p1", 0, Outcome.INFRA_FAILED, detail="Unreachable: reset")
    assert json.loads(result_line(failed))["detail"] == "Unreachable: reset"


def test_problems_from_a_count_or_a_file(tmp_path: Path) -> None:
    ns = argparse.Namespace(image="img:1", problems=3, problems_file=None)
    assert [(p.id, p.image) for p in problems_of(ns)] == [("p0", "img:1"), ("p1", "img:1"),
                                                         ("p2", "img:1")]  # fmt: skip
    f = tmp_path / "problems.jsonl"
    f.write_text('{"id": "a", "image": "x:1"}\n\n{"id": "b"}\n')
    ns = argparse.Namespace(image="img:1", problems=1, problems_file=f)
    assert [(p.id, p.image) for p in problems_of(ns)] == [("a", "x:1"), ("b", "img:1")]
    f.write_text('{"image": "x:1"}\n')
    with pytest.raises(UsageError, match=r"problems\.jsonl:1"):
        problems_of(ns)


def test_report_re_renders_a_saved_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spans = [SandboxSpan("sb-1", "p0", Source.CREATED, 0.0, t_ready=1.0, t_released=3.0)]
    records = [
        RolloutRecord(
            "p0",
            0,
            Outcome.OK,
            1.0,
            [Attempt(Source.CREATED, "sb-1", 0.0, t_acquired=1.0, t_done=2.0)],
        )
    ]
    data = RunData("none", False, 1, 1, 1, records=records, spans=spans, t_end=3.5)  # fmt: skip
    saved = write_json(tmp_path / "run.json", summarize(data), data)
    png, trace = tmp_path / "t.png", tmp_path / "t.json"
    assert main(["fleet", "report", str(saved), "--png", str(png), "--trace", str(trace)]) == 0
    out = capsys.readouterr()
    assert "1/1 valid" in out.out and "trace:" in out.err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any(e["name"] == "p0#0" for e in json.loads(trace.read_text())["traceEvents"])
    (tmp_path / "bad.json").write_text("{}")
    assert main(["fleet", "report", str(tmp_path / "bad.json")]) == 1


def test_run_needs_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "run", "img:1"]) == 2  # a usage error, not Sandman's 125
    assert "after `--`" in capsys.readouterr().err
