"""Counting running clusters (as ../shared/tools/quiet does) and deciding
whether a benchmark may start its own beside them."""

from __future__ import annotations

from pathlib import Path

from sandman.harness.cluster.running import (
    BESIDE_ENV,
    Proc,
    RunningCluster,
    beside_allowed,
    process_listing,
    refusal,
    running_clusters,
)

ETCD = "/root/.cache/sandman/etcd/v3.5.35/bin/etcd"


def test_one_cluster_per_live_etcd_with_its_data_dir() -> None:
    procs = [
        Proc(900, "etcd", (ETCD, "--name=sandman", "--data-dir=/tmp/b/etcd")),
        Proc(12, "kube-apiserver", ("kube-apiserver", "--etcd-servers=http://127.0.0.1:2379")),
        Proc(40, "etcd", (ETCD, "--data-dir", "/root/.local/state/sandman/cluster/etcd")),
        Proc(41, "etcdctl", ("etcdctl", "get", "/")),  # not a control plane
        Proc(50, "etcd", (ETCD, "--data-dir=/tmp/gone"), state="Z"),  # exited, unreaped
        Proc(60, "bash", ("bash", "-c", "etcd --data-dir=/tmp/x")),  # names etcd, is not one
    ]
    assert running_clusters(procs) == [
        RunningCluster(40, "/root/.local/state/sandman/cluster/etcd"),
        RunningCluster(900, "/tmp/b/etcd"),
    ]


def test_etcd_without_data_dir() -> None:
    assert running_clusters([Proc(7, "etcd", ("etcd",))]) == [RunningCluster(7, None)]


def test_refusal_decision() -> None:
    two = [RunningCluster(40, "/s/etcd"), RunningCluster(900, None)]
    # Nothing else runs: start.
    assert refusal([], beside=False) is None
    # Told to run beside them: start.
    assert refusal(two, beside=True) is None
    # Others run: refuse, naming them and the ways out.
    why = refusal(two, beside=False)
    assert why is not None
    assert "2 running cluster(s)" in why
    assert "etcd pid 40 (/s/etcd); etcd pid 900" in why
    assert "--beside-other-clusters" in why and BESIDE_ENV in why
    assert "SANDMAN_TEST_CLUSTER" in why


def test_beside_allowed_from_env() -> None:
    assert beside_allowed({BESIDE_ENV: "1"})
    assert beside_allowed({BESIDE_ENV: "true"})
    assert not beside_allowed({BESIDE_ENV: "0"})
    assert not beside_allowed({})


def test_process_listing_reads_proc(tmp_path: Path) -> None:
    def proc(pid: str, comm: str, stat_tail: str, cmdline: bytes) -> None:
        d = tmp_path / pid
        d.mkdir()
        (d / "comm").write_text(comm + "\n")
        (d / "stat").write_text(f"{pid} ({comm}) {stat_tail}\n")
        (d / "cmdline").write_bytes(cmdline)

    proc("40", "etcd", "S 1 40 40 0", b"etcd\0--data-dir=/s/etcd\0")
    proc("41", "a) b", "Z 1 41", b"")  # comm with ") ": state after the last ')'
    (tmp_path / "self").mkdir()
    (tmp_path / "42").mkdir()  # exited while listed: no files
    got = sorted(process_listing(tmp_path), key=lambda p: p.pid)
    assert got == [
        Proc(40, "etcd", ("etcd", "--data-dir=/s/etcd"), "S"),
        Proc(41, "a) b", (), "Z"),
    ]
