"""A run's results on disk: one JSON line per task, logs as files, resumable.

Layout of a results directory::

    run.json          the run: spec digest, pinned images, versions, options
    results.jsonl     one JSON line per (task, repeat); appended as tasks
                      finish, so a run that dies keeps what it finished;
                      rewritten in spec order at the end (the last line of
                      a task wins when reading an unfinished file)
    logs/TASK/rN/aM/  every command of attempt M of repeat N: NN-PHASE.stdout,
                      .stderr, and commands.jsonl (argv, exit code, timings)
    summary.json, summary.txt

The record format is documented in docs/eval.md; ``task_record`` builds it
(pure) so that the summary, the compare command and the docs agree on it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sandman.eval.decide import ERROR, FAIL, INFRA, PASS, SCORED

RUN_FILE = "run.json"
RESULTS_FILE = "results.jsonl"
SUMMARY_JSON = "summary.json"
SUMMARY_TEXT = "summary.txt"
FORMAT = 1  # of run.json and the result lines; bumped when a field changes meaning

Key = tuple[str, int]  # (task id, repeat)


class RunExists(Exception):
    """The directory holds a run already and resuming was not asked for."""


def key_of(rec: Mapping[str, Any]) -> Key:
    return str(rec["task"]), int(rec.get("repeat", 0))


def finished(rec: Mapping[str, Any]) -> bool:
    """Not run again on resume: scored, or broken (it would fail the same way);
    infrastructure failures are what resuming is for."""
    return rec.get("status") in (*SCORED, ERROR)


def task_record(
    *,
    task: str,
    repeat: int,
    status: str,
    reason: str,
    attempts: int,
    retries: list[dict[str, Any]],
    image: str,
    digest: str | None,
    message: str = "",
    detail: Mapping[str, Any] | None = None,
    phases: Mapping[str, float] | None = None,
    conditions: Mapping[str, Any] | None = None,
    versions: Mapping[str, Any] | None = None,
    tails: Mapping[str, str] | None = None,
    logs: str = "",
    started_at: str = "",
    finished_at: str = "",
) -> dict[str, Any]:
    assert status in (PASS, FAIL, ERROR, INFRA), status
    cond = dict(conditions or {})
    return {
        "task": task,
        "repeat": repeat,
        "status": status,
        "score": {PASS: 1, FAIL: 0}.get(status),
        "reason": reason,
        "message": message,
        "attempts": attempts,
        "retried": bool(retries),
        "retries": retries,
        "image": image,
        "image_digest": digest,
        "node": cond.get("node"),
        "phases": {k: round(v, 3) for k, v in (phases or {}).items()},
        "conditions": cond,
        "versions": dict(versions or {}),
        "detail": dict(detail or {}),
        "stdout_tail": (tails or {}).get("stdout", ""),
        "stderr_tail": (tails or {}).get("stderr", ""),
        "logs": logs,
        "started_at": started_at,
        "finished_at": finished_at,
    }


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class ResultsDir:
    """One run's directory. Used by one runner at a time (not locked: two
    runners resuming the same directory would run tasks twice)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def run_file(self) -> Path:
        return self.root / RUN_FILE

    @property
    def results_file(self) -> Path:
        return self.root / RESULTS_FILE

    def has_run(self) -> bool:
        return self.run_file.exists()

    def load_run(self) -> dict[str, Any]:
        doc = json.loads(self.run_file.read_text())
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"{self.run_file}: not a run of this version of sandman eval")
        return doc

    def write_run(self, doc: Mapping[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.run_file, json.dumps({**doc, "format": FORMAT}, indent=2) + "\n")

    def records(self) -> dict[Key, dict[str, Any]]:
        """The latest record of every (task, repeat) in the file."""
        out: dict[Key, dict[str, Any]] = {}
        if not self.results_file.exists():
            return out
        for line in self.results_file.read_text().splitlines():
            if line.strip():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by a crash mid-write: that task runs again
                out[key_of(rec)] = rec
        return out

    def append(self, rec: Mapping[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with self.results_file.open("a") as f:
            f.write(json.dumps(rec, sort_keys=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def rewrite(self, records: Iterable[Mapping[str, Any]]) -> None:
        _atomic_write(self.results_file, "".join(json.dumps(r) + "\n" for r in records))

    def attempt_logs(self, task: str, repeat: int, attempt: int) -> Path:
        return self.root / "logs" / task / f"r{repeat}" / f"a{attempt}"

    def write_summary(self, summary: Mapping[str, Any], text: str) -> None:
        _atomic_write(self.root / SUMMARY_JSON, json.dumps(summary, indent=2) + "\n")
        _atomic_write(self.root / SUMMARY_TEXT, text)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a results directory or of a results.jsonl file."""
    d = ResultsDir(path if path.is_dir() else path.parent)
    if path.is_file():
        d = ResultsDir(path.parent)
        if path.name != RESULTS_FILE:
            recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            return list({key_of(r): r for r in recs}.values())
    if not d.results_file.exists():
        raise FileNotFoundError(f"{path}: no {RESULTS_FILE} (not a results directory)")
    return list(d.records().values())
