"""A signal while a component starts is held until its pid file names it, and
`down` stops every process with a pid file in the cluster's run dir."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from sandman.harness.cluster.config import ClusterConfig
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.process import ManagedProcess, _signals_deferred


def test_signal_held_until_the_block_ends() -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda s, _f: got.append(s))
    try:
        with _signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)
            assert got == []
        signal.sigtimedwait([], 0)
        assert got == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_down_stops_a_process_no_component_list_names(tmp_path: Path) -> None:
    cluster = LocalCluster(ClusterConfig(state_dir=tmp_path / "state"), progress=lambda _m: None)
    stray = ManagedProcess("sandman-old", ("sleep", "60"), cluster.layout.run, cluster.layout.logs)
    pid = stray.start()
    try:
        assert "sandman-old" in cluster.down()
        assert stray.running_pid() is None
    finally:
        if stray.running_pid() is not None:
            os.kill(pid, signal.SIGKILL)
