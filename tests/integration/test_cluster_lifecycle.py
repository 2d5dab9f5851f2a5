"""`up` is idempotent and `down` leaves no process and no listening port behind."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from sandman.harness.cluster.config import ClusterConfig, Ports
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.testing import cluster_unavailable_reason
from tests.procs import processes_mentioning


def listening_ports() -> set[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_up_is_idempotent_and_down_leaves_nothing(tmp_path: Path) -> None:
    reason = cluster_unavailable_reason()
    if reason or os.environ.get("SANDMAN_TEST_CLUSTER"):
        pytest.skip(reason or "uses a private cluster; skipped when reusing one")
    cfg = dataclasses.replace(
        ClusterConfig(state_dir=tmp_path / "state"), ports=Ports.free(), kwok_nodes=1
    )
    cluster = LocalCluster(cfg, progress=lambda _msg: None)
    try:
        cluster.up()
        pids = {p.name: p.running_pid() for p in cluster.processes()}
        assert all(pids.values()), pids
        # Only what this cluster runs: the control plane and kwok, nothing of Sandman's.
        p = cfg.ports
        control_plane = {
            p.etcd_client,
            p.etcd_peer,
            p.apiserver,
            p.controller_manager,
            p.scheduler,
            p.kwok,
        }
        assert control_plane <= listening_ports()

        cluster.up()  # again: nothing restarted
        assert {p.name: p.running_pid() for p in cluster.processes()} == pids
        st = cluster.status()
        assert st.running and all(c.healthy for c in st.components)
        assert (st.nodes_ready, st.nodes_total) == (1, 1)
    finally:
        stopped = cluster.down()
    assert set(stopped) == set(pids)
    assert processes_mentioning(str(cfg.state_dir)) == {}
    assert not {port for _, port in cfg.ports.items()} & listening_ports()
    # State is kept (without --purge) so that `up` resumes the same cluster.
    assert cluster.kubeconfig.exists()
    cluster.down(purge=True)
    assert not cfg.state_dir.exists()
