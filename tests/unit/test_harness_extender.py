"""What the local cluster runs: the extender's argv and its scheduler config entry."""

from __future__ import annotations

import sys
from pathlib import Path

from sandman.harness.cluster.components import scheduler_config
from sandman.harness.cluster.extender import extender_spec, scheduler_process, serve_argv


def test_scheduler_config_entry_for_the_extender() -> None:
    doc = scheduler_config("sandman-scheduler", Path("/kc"), (extender_spec(8890),))
    assert doc["profiles"] == [{"schedulerName": "sandman-scheduler"}]
    assert doc["extenders"] == [
        {
            "urlPrefix": "http://127.0.0.1:8890",
            "filterVerb": "",
            "prioritizeVerb": "prioritize",
            "weight": 20,
            "nodeCacheCapable": True,
            "ignorable": True,
            "httpTimeout": "100ms",
            "enableHTTPS": False,
        }
    ]


def test_serve_argv() -> None:
    assert serve_argv(8890, Path("/kc"), extra=["--crowd-limit=8"]) == [
        sys.executable,
        "-m",
        "sandman.extender",
        "serve",
        "--listen=127.0.0.1:8890",
        "--kubeconfig=/kc",
        "--crowd-limit=8",
    ]


def test_scheduler_process_keeps_everything_in_its_work_dir(tmp_path: Path) -> None:
    p = scheduler_process(
        Path("/bin/kube-scheduler"), Path("/kc"), tmp_path, name="extra-1", port=12345
    )
    assert (tmp_path / "extra-1.yaml").exists()
    assert p.run_dir == tmp_path / "run" and p.log_dir == tmp_path / "logs"
    assert f"--cert-dir={tmp_path / 'extra-1-certs'}" in p.argv
    assert "--secure-port=12345" in p.argv
