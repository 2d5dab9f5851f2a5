"""The real node's claim: one cluster at a time, and only the holder tears down."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sandman.harness.cluster import claim


@pytest.fixture(autouse=True)
def claim_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(claim, "CLAIM_DIR", tmp_path / "run")
    return tmp_path


def _cluster(root: Path, name: str) -> Path:
    d = root / name
    (d / "run").mkdir(parents=True)
    return d


def test_one_holder_at_a_time(claim_dir: Path) -> None:
    a, b = _cluster(claim_dir, "a"), _cluster(claim_dir, "b")
    assert claim.take(a) is None
    assert claim.take(a) is None  # taking it again is fine
    # A fresh claim counts although nothing of A runs yet.
    assert claim.take(b) == str(a.resolve())
    assert claim.held_by(a) and not claim.held_by(b)
    claim.release(b)  # not B's to release
    assert claim.held_by(a)
    claim.release(a)
    assert claim.take(b) is None


def test_a_claim_whose_cluster_is_gone_or_dead_is_stale(claim_dir: Path) -> None:
    a, b = _cluster(claim_dir, "a"), _cluster(claim_dir, "b")
    assert claim.take(a) is None
    # Old, and its processes dead (a pid that cannot exist): stale.
    later = time.time() + claim.CLAIM_GRACE_S + 1
    (a / "run" / "kubelet.pid").write_text("999999999 0\n")
    assert claim.holder_if_live(now=later) is None
    # Old but one of its processes runs (ours, here): held.
    (a / "run" / "registry.pid").write_text(f"{os.getpid()} 0\n")
    assert claim.holder_if_live(now=later) == str(a.resolve())
    # Its state dir deleted (a purged test cluster): stale at once.
    for f in (a / "run").iterdir():
        f.unlink()
    (a / "run").rmdir()
    a.rmdir()
    assert claim.take(b) is None
