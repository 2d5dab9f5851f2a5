"""`sandman bench reaper`: which clusters run a reaper of their own that would race the bench's.

On a `make up` cluster the sandman-reaper Deployment (leader-elected, every
namespace) reclaims part of the bench's sandboxes, so the bench's own reaper
never counts them all and its wait for its counters times out. The bench
pauses whatever ``competing_reaper`` names.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sandman.bench.reaper import competing_reaper
from sandman.harness.cluster.config import ClusterConfig, RealNodeConfig


def _config(tmp_path: Path, **kw: object) -> ClusterConfig:
    return dataclasses.replace(ClusterConfig(state_dir=tmp_path, cache_dir=tmp_path), **kw)


def test_make_up_cluster_runs_the_reaper_deployment(tmp_path: Path) -> None:
    # `make up`: the real node, Sandman in-cluster, the reaper deployed (the defaults).
    cfg = _config(tmp_path, deploy_sandman=True, real_node=RealNodeConfig(enabled=True))
    assert cfg.deploy_reaper
    assert competing_reaper(cfg) == "in-cluster"


def test_host_components_run_a_host_reaper(tmp_path: Path) -> None:
    cfg = _config(
        tmp_path,
        deploy_sandman=True,
        host_components=True,
        real_node=RealNodeConfig(enabled=True),
    )
    assert competing_reaper(cfg) == "host"
    assert competing_reaper(_config(tmp_path, deploy_sandman=True)) == "host"  # no real node


def test_test_clusters_and_bare_clusters_run_none(tmp_path: Path) -> None:
    # harness/testing.py: tests and benches run their own, scoped reapers.
    test_cluster = _config(
        tmp_path, deploy_sandman=True, deploy_reaper=False, real_node=RealNodeConfig(enabled=True)
    )
    assert competing_reaper(test_cluster) is None
    assert competing_reaper(_config(tmp_path, deploy_sandman=False)) is None
