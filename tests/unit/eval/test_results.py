"""The results directory: lines appended as tasks finish, the last one wins, and
what a resumed run keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandman.eval.results import ResultsDir, finished, read_records, task_record


def _rec(task: str, status: str, repeat: int = 0) -> dict:
    return task_record(task=task, repeat=repeat, status=status, reason="r", attempts=1,
                       retries=[], image="x:1", digest="sha256:a")  # fmt: skip


def test_lines_last_one_wins_and_resume_keeps_finished(tmp_path: Path) -> None:
    d = ResultsDir(tmp_path / "run")
    d.write_run({"spec_digest": "sha256:s"})
    assert d.load_run()["format"] == 1
    d.append(_rec("a", "infra_failed"))
    d.append(_rec("b", "pass"))
    d.append(_rec("a", "fail"))  # a resumed run scored it
    with d.results_file.open("a") as f:
        f.write('{"task": "c", "sta')  # a crash mid-line: c runs again
    recs = d.records()
    assert sorted(recs) == [("a", 0), ("b", 0)] and recs[("a", 0)]["status"] == "fail"
    assert finished(_rec("x", "pass")) and finished(_rec("x", "error"))
    assert not finished(_rec("x", "infra_failed"))
    d.rewrite([recs[("a", 0)], recs[("b", 0)]])
    assert [json.loads(x)["task"] for x in d.results_file.read_text().splitlines()] == ["a", "b"]
    assert {r["task"] for r in read_records(d.root)} == {"a", "b"}
    assert {r["task"] for r in read_records(d.results_file)} == {"a", "b"}
    assert d.attempt_logs("a", 0, 2) == d.root / "logs" / "a" / "r0" / "a2"


def test_record_scores_only_scored_statuses() -> None:
    assert _rec("a", "pass")["score"] == 1 and _rec("a", "fail")["score"] == 0
    assert _rec("a", "infra_failed")["score"] is None and _rec("a", "error")["score"] is None
    with pytest.raises(AssertionError):
        _rec("a", "maybe")


def test_not_a_run(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text('{"format": 99}')
    with pytest.raises(ValueError, match="not a run"):
        ResultsDir(tmp_path).load_run()
    with pytest.raises(FileNotFoundError, match="not a results directory"):
        read_records(tmp_path)
