"""`sandman fleet run` on the real node: results stream to stdout as JSON lines, the
report and the saved run (JSON, PNG, Perfetto trace) follow; `report` re-renders it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode


def test_fleet_run_streams_json_lines_and_saves_the_run(
    cluster: LocalCluster, namespace: str, real_node: RealNode, images: dict[str, str],
    tmp_path: Path,
) -> None:  # fmt: skip
    sandman = str(Path(sys.executable).parent / "sandman")
    out = subprocess.run(
        [sandman, "fleet", "run", images["tiny"], "--problems", "2", "--rollouts", "2",
         "--concurrency", "4", "--kubeconfig", str(cluster.kubeconfig), "-n", namespace,
         "--pod-command", "sleep infinity", "--node-selector", "sandman.dev/node-kind=real",
         "--json", str(tmp_path / "run.json"), "--png", str(tmp_path / "run.png"),
         "--trace", str(tmp_path / "trace.json"),
         "--", "sh", "-c", 'test "$SANDMAN_ROLLOUT" = 0'],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    # rollout 0 of each problem exits 0 (reward 1.0), rollout 1 exits 1 (0.0): a valid result.
    assert sorted((r["problem"], r["rollout"], r["reward"]) for r in lines) == [
        ("p0", 0, 1.0), ("p0", 1, 0.0), ("p1", 0, 1.0), ("p1", 1, 0.0)]  # fmt: skip
    assert all(r["outcome"] == "ok" and r["ttfc_s"] > 0 for r in lines)
    assert "4/4 valid" in out.stderr and "\r" not in out.stderr  # no bar off a terminal
    assert (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert {e["name"] for e in trace if e["ph"] == "X"} >= {"warming", "busy", "p0#0", "p1#1"}
    again = subprocess.run([sandman, "fleet", "report", str(tmp_path / "run.json")],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert "4/4 valid" in again.stdout
