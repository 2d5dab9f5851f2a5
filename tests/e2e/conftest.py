"""e2e fixtures: the runtime a test's sandboxes run under (see runtimes.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import CoreV1Api

from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from tests.e2e.runtimes import gvisor_policy, use_runtime


@pytest.fixture(scope="session")
def gvisor_rule_file(cluster: LocalCluster, real_node: RealNode) -> Iterator[Any]:
    """The cluster's policy with the test-gvisor rule, for the whole session."""
    with gvisor_policy(cluster) as path:
        yield path


@pytest.fixture
def runtime(
    request: pytest.FixtureRequest,
    core: CoreV1Api,
    namespace: str,
    images: dict[str, str],
) -> str:
    """``runc`` or ``gvisor`` (parametrize with indirect=["runtime"]): the test's
    namespace is set up so that its sandboxes run under that runtime."""
    name = getattr(request, "param", "runc")
    if name == "gvisor":
        request.getfixturevalue("gvisor_rule_file")
        use_runtime(core, namespace, name, images["tiny"])
    return name
