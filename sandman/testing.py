"""Test-bed helpers: get a running local cluster for a test session.

Used by tests and benchmarks alike, so that both bring up (or reuse) the same
kind of cluster the same way.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sandman.cluster.config import ClusterConfig, Ports
from sandman.cluster.local import LocalCluster

# Point this at the state dir of a running cluster (e.g. the `make up` one) to
# run tests against it instead of starting a private one.
REUSE_ENV = "SANDMAN_TEST_CLUSTER"


@dataclass
class TestBed:
    cluster: LocalCluster
    owned: bool  # started by us, so ours to stop

    def close(self) -> None:
        if self.owned:
            self.cluster.down(purge=os.environ.get("SANDMAN_KEEP_TEST_CLUSTER") != "1")


def cluster_unavailable_reason() -> str | None:
    """Why the integration tier cannot run on this machine, or None."""
    if os.environ.get(REUSE_ENV):
        return None
    if shutil.which("go") is None:
        return "no `go` on PATH to build the Kubernetes binaries"
    return None


def start_test_cluster(kwok_nodes: int = 3) -> TestBed:
    reuse = os.environ.get(REUSE_ENV)
    if reuse:
        cluster = LocalCluster.at(Path(reuse).expanduser())
        st = cluster.status()
        if not st.running:
            raise RuntimeError(f"{REUSE_ENV}={reuse}: that cluster is not running")
        return TestBed(cluster, owned=False)
    state = Path(tempfile.mkdtemp(prefix="sandman-test-cluster-"))
    cfg = dataclasses.replace(
        ClusterConfig(state_dir=state), ports=Ports.free(), kwok_nodes=kwok_nodes
    )
    cluster = LocalCluster(cfg)
    try:
        cluster.up()
    except BaseException:
        cluster.down(purge=False)
        raise
    return TestBed(cluster, owned=True)
