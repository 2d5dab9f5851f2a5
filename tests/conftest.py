"""Test tiers and shared fixtures.

Tiers follow the folder a test lives in (tests/unit, tests/integration,
tests/e2e) and are applied as markers, so `-m unit` selects one tier. The
cluster is session-scoped; every test that touches it gets a fresh namespace.
"""

from __future__ import annotations

import collections
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.images.build import ImageBuilder
from sandman.harness.kube import api_client
from sandman.harness.testing import ClusterBed, cluster_unavailable_reason, start_test_cluster

TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))


# -- the session cluster ---------------------------------------------------
_cluster_error: list[str] = []


@pytest.fixture(scope="session")
def testbed() -> Iterator[ClusterBed]:
    reason = cluster_unavailable_reason()
    if reason:
        pytest.skip(f"integration tier skipped: {reason}")
    if _cluster_error:
        pytest.fail(f"local cluster failed to start earlier: {_cluster_error[0]}")
    try:
        bed = start_test_cluster()
    except Exception as e:
        _cluster_error.append(str(e).splitlines()[0])
        raise
    yield bed
    bed.close()


@pytest.fixture(scope="session")
def cluster(testbed: ClusterBed) -> LocalCluster:
    return testbed.cluster


@pytest.fixture(scope="session")
def real_node(testbed: ClusterBed) -> RealNode:
    """The real node (kubelet + containerd); skips the test where there is none."""
    if testbed.no_real_node or testbed.cluster.real_node is None:
        pytest.skip(f"e2e tier skipped: no real node: {testbed.no_real_node}")
    return testbed.cluster.real_node


@pytest.fixture(scope="session")
def images(real_node: RealNode, cluster: LocalCluster) -> dict[str, str]:
    """Our test images, built (cached) and pushed to the node's registry: name -> ref."""
    builder = ImageBuilder(cluster.config.cache_dir)
    return {name: builder.build_and_push(name, real_node.registry).ref for name in ("tiny", "swe")}


@pytest.fixture(scope="session")
def core(cluster: LocalCluster) -> CoreV1Api:
    return CoreV1Api(api_client(cluster.kubeconfig))


@pytest.fixture
def namespace(core: CoreV1Api, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (kept if the test failed
    and SANDMAN_KEEP_FAILED=1, for debugging)."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:40].strip("-")
    name = f"t-{base}-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"sandman.dev/test": "true"}}})
    yield name
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed and os.environ.get("SANDMAN_KEEP_FAILED") == "1":
        return
    try:
        core.delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise


# In CI every tier must run: a skipped test (a missing package, no real node)
# fails the run instead of passing quietly.
REQUIRE_ALL_ENV = "SANDMAN_REQUIRE_ALL_TIERS"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    rep = yield
    if rep.skipped and os.environ.get(REQUIRE_ALL_ENV) == "1" and not hasattr(rep, "wasxfail"):
        why = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"skipped, but {REQUIRE_ALL_ENV}=1 requires every test to run: {why}"
    setattr(item, f"rep_{rep.when}", rep)
    return rep


# -- a per-tier summary, so `make test` says what it skipped and why --------
def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    counts: dict[str, collections.Counter[str]] = {t: collections.Counter() for t in TIERS}
    reasons: dict[str, set[str]] = {t: set() for t in TIERS}
    for outcome in ("passed", "failed", "skipped", "error"):
        for rep in terminalreporter.stats.get(outcome, []):
            tier = next((t for t in TIERS if t in getattr(rep, "keywords", {})), None)
            if tier is None:
                continue
            if outcome == "passed" and rep.when != "call":
                continue
            counts[tier][outcome] += 1
            if outcome == "skipped" and isinstance(rep.longrepr, tuple):
                reasons[tier].add(str(rep.longrepr[2]).removeprefix("Skipped: "))
    tr = terminalreporter
    tr.section("sandman test tiers")
    for tier in TIERS:
        c = counts[tier]
        if not sum(c.values()):
            tr.write_line(f"{tier:<12} no tests collected")
            continue
        line = ", ".join(f"{n} {k}" for k, n in sorted(c.items()))
        tr.write_line(f"{tier:<12} {line}")
        for r in sorted(reasons[tier]):
            tr.write_line(f"{'':<12} skipped because: {r}")
