"""`sandman bench`'s runner: interruption, refusal beside other clusters, and
the load/cluster conditions in the JSON record."""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from sandman.bench.cli import _guarded
from sandman.harness.cluster import running


def _args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(json=kw.get("json"), beside_other_clusters=kw.get("beside", False))


def test_sigterm_tears_down_and_exits_143(capsys: pytest.CaptureFixture[str]) -> None:
    down = []

    def body() -> dict[str, Any]:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)
            return {"figure": 1}
        finally:
            down.append(True)

    assert _guarded("x", _args(), body) == 143
    assert down == [True]
    assert "sandman bench x: interrupted by SIGTERM" in capsys.readouterr().err


def test_refusal_is_a_message_and_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    def body() -> dict[str, Any]:
        raise running.OtherClustersRunning("refusing to start ...")

    assert _guarded("x", _args(), body) == 3
    assert "sandman bench x: refusing to start" in capsys.readouterr().err


def test_flag_allows_for_the_run_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(running.BESIDE_ENV, raising=False)
    seen = []
    _guarded("x", _args(beside=True), lambda: seen.append(os.environ.get(running.BESIDE_ENV)) or {})
    assert seen == ["1"]
    assert running.BESIDE_ENV not in os.environ


def test_json_keeps_its_keys_and_adds_conditions(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert _guarded("x", _args(json=out), lambda: {"up_s": 1.5}) == 0
    doc = json.loads(out.read_text())
    assert {"benchmark", "time", "machine", "up_s"} <= doc.keys()
    assert doc["benchmark"] == "x" and doc["up_s"] == 1.5
    for when in ("start", "end"):
        c = doc["conditions"][when]
        assert len(c["load_avg"]) == 3 and isinstance(c["clusters_running"], int)
