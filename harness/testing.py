"""Test-bed helpers: get a running local cluster for a test session.

Used by tests and benchmarks alike, so that both bring up (or reuse) the same
kind of cluster the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import inspect
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes.client import CoreV1Api

from sandman.client.startup import ready
from sandman.contract import PREFIX
from sandman.harness.cluster import claim, running
from sandman.harness.cluster.config import ClusterConfig, Ports, RealNodeConfig, default_state_dir
from sandman.harness.cluster.hostsetup import (
    bridge_exists,
    pids_with_arg,
    real_node_unsupported_reason,
)
from sandman.harness.cluster.kwok_nodes import NODE_KIND_LABEL
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.kube import raw, started_since

# Point this at the state dir of a running cluster (e.g. the `make up` one) to
# run tests against it instead of starting a private one.
REUSE_ENV = "SANDMAN_TEST_CLUSTER"

T = TypeVar("T")


@dataclass
class ClusterBed:
    cluster: LocalCluster
    owned: bool  # started by us, so ours to stop
    # Why the e2e tier cannot run on this bed, or None when the real node is up.
    no_real_node: str | None = None

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


# Seconds a new test session waits for another cluster's real node to go away
# (one real node per machine) before it runs without one; default 0.
WAIT_ENV = "SANDMAN_TEST_REAL_NODE_WAIT"


def real_node_reason_for_new_cluster(state_dir: Path | None = None) -> str | None:
    """Why a new test cluster should not get the real node, or None.

    With ``state_dir``, None also means the real node is claimed for that
    cluster (``claim.take``, atomic): two sessions that wait at once cannot
    both get it.
    """
    if os.environ.get("SANDMAN_TEST_REAL_NODE") == "0":
        return "SANDMAN_TEST_REAL_NODE=0"
    why = real_node_unsupported_reason()
    if why:
        return why
    node = RealNodeConfig()
    deadline = time.monotonic() + float(os.environ.get(WAIT_ENV) or 0)
    announced = False

    def legacy() -> bool:
        # A real node started before claims existed (no claim): its kubelet
        # runs, or its registry still holds the port while it stops.
        kubelet = bridge_exists(node.bridge) and pids_with_arg(f"--hostname-override={node.name}")
        with socket.socket() as s:
            registry = s.connect_ex(("127.0.0.1", node.registry_port)) == 0
        return bool(kubelet) or registry

    def busy() -> bool:
        if state_dir is None:
            return claim.holder_if_live() is not None or bridge_exists(node.bridge)
        if claim.take(state_dir) is not None:
            return True
        if legacy():
            claim.release(state_dir)
            return True
        return False

    while busy() and time.monotonic() < deadline:
        if not announced:
            print(f"waiting for another cluster's real node to stop ({WAIT_ENV})", flush=True)
            announced = True
        time.sleep(2)
    if busy():
        holder = claim.holder_if_live() or f"bridge {node.bridge}"
        return (
            f"another cluster's real node runs on this machine ({holder}); "
            f"point {REUSE_ENV} at that cluster's state dir to use it"
        )
    return None


def start_test_cluster(kwok_nodes: int = 3) -> ClusterBed:
    reuse = os.environ.get(REUSE_ENV)
    if reuse:
        cluster = LocalCluster.at(Path(reuse).expanduser())
        st = cluster.status()
        if not st.running:
            raise RuntimeError(f"{REUSE_ENV}={reuse}: that cluster is not running")
        no_real = None if cluster.real_node else f"the cluster at {reuse} has no real node"
        return ClusterBed(cluster, owned=False, no_real_node=no_real)
    state = Path(tempfile.mkdtemp(prefix="sandman-test-cluster-"))
    no_real = real_node_reason_for_new_cluster(state)
    cfg = dataclasses.replace(
        ClusterConfig(state_dir=state),
        ports=Ports.free(),
        kwok_nodes=kwok_nodes,
        real_node=RealNodeConfig(enabled=no_real is None),
        deploy_sandman=True,
        deploy_reaper=False,
        # In-cluster whenever the real node is there (the path users take);
        # SANDMAN_TEST_HOST_COMPONENTS=1 runs host processes (quicker to iterate).
        host_components=os.environ.get("SANDMAN_TEST_HOST_COMPONENTS") == "1",
    )
    cluster = LocalCluster(cfg)
    try:
        cluster.up()
    except BaseException:
        cluster.down(purge=False)
        raise
    return ClusterBed(cluster, owned=True, no_real_node=no_real)


def bench_bed(*, need_real_node: bool, kwok_nodes: int = 3) -> ClusterBed:
    """A cluster for a benchmark: the one named by SANDMAN_TEST_CLUSTER, else the
    default (`make up`) cluster when it runs and fits, else a private one (not
    beside other running clusters unless allowed: harness/cluster/running.py)."""
    if not os.environ.get(REUSE_ENV):
        default = default_state_dir()
        if ClusterConfig.load(default) is not None:
            cluster = LocalCluster.at(default, progress=lambda _m: None)
            fits = cluster.real_node is not None or not need_real_node
            if fits and cluster.status().running:
                return ClusterBed(cluster, owned=False)
        # A private cluster beside running ones would measure their load too.
        running.check_may_start_cluster()
    bed = start_test_cluster(kwok_nodes)
    if need_real_node and bed.no_real_node:
        bed.close()
        raise RuntimeError(f"this benchmark needs the real node: {bed.no_real_node}")
    return bed


@contextlib.contextmanager
def real_node_bench(image: str) -> Iterator[tuple[LocalCluster, RealNode, str]]:
    """A bench bed with the real node and ``image`` (a recipe name) built,
    pushed and already on the node: (cluster, node, image ref). Benchmarks of
    cached-image starts measure the start, not a pull."""
    from sandman.harness.images.build import ImageBuilder

    bed = bench_bed(need_real_node=True)
    try:
        cluster, node = bed.cluster, bed.cluster.real_node
        assert node is not None
        ref = ImageBuilder(cluster.config.cache_dir).build_and_push(image, node.registry).ref
        node.crictl("pull", ref)
        yield cluster, node, ref
    finally:
        bed.close()


def kubectl(cluster: LocalCluster, *args: str, timeout: float = 60, check: bool = True) -> str:
    """Run the cluster's own kubectl build; returns stdout."""
    proc = subprocess.run(
        [str(cluster.binaries.kubectl), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def free_port() -> int:
    """A loopback port nobody listens on right now (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(pred: Callable[[], T], *, timeout: float = 60.0, what: str = "condition") -> T:
    """Poll ``pred`` until it returns something truthy (tests only)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last={last!r}")


async def async_wait_for(
    pred: Callable[[], Awaitable[T] | T], *, timeout: float = 60.0, what: str = "condition"
) -> T:
    """``wait_for`` for async tests: ``pred`` may be sync or a coroutine function."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        got = pred()
        last = await got if inspect.isawaitable(got) else got  # type: ignore[assignment]
        if last:
            return last  # type: ignore[return-value]
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last={last!r}")


def real_pod(name: str, image: str, command: list[str] | None = None) -> dict[str, Any]:
    """A pod for the real node (kwok nodes are tainted, the selector makes it explicit)."""
    container: dict[str, Any] = {"name": "main", "image": image}
    if command:
        container["command"] = command
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {NODE_KIND_LABEL: "real"},
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }


def wait_ready(
    core: CoreV1Api,
    ns: str,
    name: str,
    timeout: float = 120,
    started_after: datetime | None = None,
) -> dict[str, Any]:
    """Wait until a pod reports Ready (with ``started_after``: in containers
    started since then, e.g. a node restart); returns the pod (plain JSON)."""

    def fresh_and_ready() -> dict[str, Any] | None:
        pod = raw(core.read_namespaced_pod(name, ns, _preload_content=False))
        if started_after is not None and not started_since(pod, started_after):
            return None
        return pod if ready(pod) else None

    return wait_for(fresh_and_ready, timeout=timeout, what=f"pod {ns}/{name} Ready")


TEST_POLICY_LABEL = PREFIX + "test-policy"


@contextlib.contextmanager
def policy_rule(
    cluster: LocalCluster, name: str, selector: dict[str, str], **fields: Any
) -> Iterator[None]:
    """Prepend, for the block, a rule governing namespaces labelled
    ``selector``: a copy of the cluster's default rule (the one without a
    namespaceSelector) with ``fields`` replaced. The policy is restored after;
    writes return once every webhook enforces them."""
    deployment = cluster.deployment
    assert deployment is not None, "the cluster runs Sandman's webhook"
    handle = deployment.policy
    original = handle.read()
    doc = yaml.safe_load(original)
    rules = doc.get("rules") or []
    base = next((r for r in rules if "namespaceSelector" not in r), rules[-1] if rules else {})
    rule = {
        **copy.deepcopy(base),
        **fields,
        "name": name,
        "namespaceSelector": {"matchLabels": selector},
    }
    doc["rules"] = [rule, *rules]
    handle.write(yaml.safe_dump(doc, sort_keys=False))
    try:
        yield
    finally:
        handle.write(original)


@contextlib.contextmanager
def namespace_rule(
    cluster: LocalCluster, core: CoreV1Api, namespace: str, **fields: Any
) -> Iterator[None]:
    """Govern ``namespace`` by a rule of its own for the block (``policy_rule``
    selecting a label put on the namespace)."""
    core.patch_namespace(namespace, {"metadata": {"labels": {TEST_POLICY_LABEL: namespace}}})
    with policy_rule(cluster, f"test-{namespace}"[:63], {TEST_POLICY_LABEL: namespace}, **fields):
        yield
