"""The extender deciding placement for a real kube-scheduler, on simulated nodes.

Self-contained: the module starts its own extender (``python -m
sandman.extender serve``) and its own kube-scheduler whose only profile,
``extender-test-<hex>``, calls it; each test creates its own nodes with chosen
``status.images``, labelled and tainted with the module's id, so that no other
test's pods can land on them and these pods land nowhere else.
"""

from __future__ import annotations

import json
import ssl
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.harness.cluster.components import KWOK_NODE_ANNOTATION
from sandman.harness.cluster.config import KwokNodeShape
from sandman.harness.cluster.extender import extender_process, extender_spec, scheduler_process
from sandman.harness.cluster.kwok_nodes import KWOK_TOLERATION, kwok_node
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.process import ManagedProcess, wait_until
from sandman.harness.kube import raw
from sandman.harness.probes import insecure_context
from sandman.harness.testing import free_port, wait_for

TEST_LABEL = "sandman.dev/extender-test"
GB = 10**9
DIGEST = "sha256:" + "5a" * 32


def _get(url: str, ctx: ssl.SSLContext | None = None) -> Any:
    with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
        return json.loads(r.read()) if r.headers.get_content_type() == "application/json" else r


@dataclass
class Bed:
    tid: str
    scheduler_name: str
    extender: ManagedProcess
    scheduler: ManagedProcess
    extender_url: str

    def where(self, image: str) -> dict[str, Any]:
        q = urllib.parse.urlencode({"image": image})
        return dict(_get(f"{self.extender_url}/v1/images?{q}"))

    def prioritize_calls(self) -> float:
        with urllib.request.urlopen(self.extender_url + "/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith('sandman_extender_requests_total{code="200",verb="prioritize"}'):
                    return float(line.split()[-1])
        return 0.0

    def start_extender(self) -> None:
        self.extender.start()
        wait_until(
            self.extender,
            lambda: bool(_get(self.extender_url + "/readyz")["ok"]),
            timeout_s=30,
            what="ready",
        )


@pytest.fixture(scope="module")
def bed(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    tid = uuid.uuid4().hex[:6]
    tmp: Path = tmp_path_factory.mktemp(f"extender-{tid}")
    ext_port, sched_port = free_port(), free_port()
    extender = extender_process(
        ext_port, cluster.kubeconfig, tmp, name=f"extender-{tid}", extra=["--crowd-limit=4"]
    )
    name = f"extender-test-{tid}"
    scheduler = scheduler_process(
        cluster.binaries.kube_scheduler,
        cluster.layout.kubeconfig("scheduler"),
        tmp,
        name=name,
        port=sched_port,
        extenders=(extender_spec(ext_port),),
    )
    b = Bed(tid, name, extender, scheduler, f"http://127.0.0.1:{ext_port}")
    insecure = insecure_context()
    try:
        b.start_extender()
        scheduler.start()
        wait_until(
            scheduler,
            lambda: _get(f"https://127.0.0.1:{sched_port}/healthz", insecure).status == 200,
            timeout_s=30,
            what="healthy",
        )
        yield b
    finally:
        scheduler.stop()
        extender.stop()


@pytest.fixture
def make_nodes(core: CoreV1Api, bed: Bed, namespace: str) -> Iterator[Callable[..., list[str]]]:
    """Create nodes for one test; they, and every pod bound to them, go afterwards."""
    created: list[str] = []

    def make(
        group: str,
        specs: list[dict[str, Any]],
    ) -> list[str]:
        names = []
        for i, spec in enumerate(specs):
            name = f"ext-{bed.tid}-{group}-{i}"
            node = kwok_node(
                name,
                spec.get("shape", KwokNodeShape()),
                images=spec.get("images", []),
                labels={TEST_LABEL: f"{bed.tid}-{group}"},
            )
            node["spec"]["taints"].append(
                {"key": TEST_LABEL, "value": bed.tid, "effect": "NoSchedule"}
            )
            if spec.get("unmanaged"):
                # No kwok: pods bound here stay "bound, not started" (a pull in
                # progress). Ready for the test's few seconds; no heartbeat after.
                del node["metadata"]["annotations"][KWOK_NODE_ANNOTATION]
                node["status"]["conditions"] = [
                    {"type": "Ready", "status": "True", "reason": "Test", "message": "test"}
                ]
            core.create_node(node)
            created.append(name)
            names.append(name)
        return names

    yield make
    # Pods on the unmanaged nodes have no kubelet to confirm their deletion.
    for p in raw(core.list_namespaced_pod(namespace, _preload_content=False))["items"]:
        try:
            core.delete_namespaced_pod(p["metadata"]["name"], namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise
    for name in created:
        try:
            core.delete_node(name)
        except ApiException as e:
            if e.status != 404:
                raise


def pod(
    bed: Bed,
    group: str,
    image: str,
    *,
    name: str | None = None,
    scheduler: str | None = "",
    node_name: str | None = None,
    cpu: str = "500m",
    memory: str = "1Gi",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {TEST_LABEL: f"{bed.tid}-{group}"},
        "tolerations": [
            KWOK_TOLERATION,
            {"key": TEST_LABEL, "operator": "Equal", "value": bed.tid, "effect": "NoSchedule"},
            # The unmanaged node may be marked not ready while a test runs.
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists"},
        ],
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": image,
                "resources": {"requests": {"cpu": cpu, "memory": memory}},
            }
        ],
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler or bed.scheduler_name
    if node_name:
        spec["nodeName"] = node_name
    meta: dict[str, Any] = {"name": name} if name else {"generateName": f"{group}-"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def create(core: CoreV1Api, ns: str, body: dict[str, Any]) -> str:
    return str(
        raw(core.create_namespaced_pod(ns, body, _preload_content=False))["metadata"]["name"]
    )


def bound_node(core: CoreV1Api, ns: str, name: str, timeout: float = 30) -> str:
    def node() -> str | None:
        p = raw(core.read_namespaced_pod(name, ns, _preload_content=False))
        return p["spec"].get("nodeName")

    return wait_for(node, timeout=timeout, what=f"pod {ns}/{name} bound")


def image(bed: Bed, what: str) -> str:
    return f"127.0.0.1:5000/sandman-test/{what}-{bed.tid}"


def holder_setup(
    bed: Bed, make_nodes: Callable[..., list[str]], core: CoreV1Api, ns: str, group: str
) -> tuple[list[str], str]:
    """Three nodes; the middle one holds a 3 GB image and is the fullest.

    It reports the image as a kubelet does: repo digest first, then the tag.
    """
    img = image(bed, group)
    entry = {"names": [f"{img}@{DIGEST}", f"{img}:latest"], "sizeBytes": 3 * GB}
    small = KwokNodeShape(cpu="4", memory="8Gi")
    nodes = make_nodes(group, [{}, {"shape": small, "images": [entry]}, {}])
    # Fill it: 3 of its 4 CPUs and 6 of 8 GiB, bound directly (no scheduler).
    create(core, ns, pod(bed, group, img, node_name=nodes[1], cpu="3", memory="6Gi"))
    wait_for(
        lambda: nodes[1] in {h["node"] for h in bed.where(f"{img}:latest")["holders"]},
        timeout=15,
        what="the extender to see the holder",
    )
    return nodes, img


def test_pod_lands_where_its_image_is_though_other_nodes_are_emptier(
    core: CoreV1Api, namespace: str, bed: Bed, make_nodes: Callable[..., list[str]]
) -> None:
    nodes, img = holder_setup(bed, make_nodes, core, namespace, "holder")
    name = create(core, namespace, pod(bed, "holder", f"{img}:latest"))
    assert bound_node(core, namespace, name) == nodes[1]


def test_short_name_and_digest_match_the_reported_names(
    core: CoreV1Api, namespace: str, bed: Bed, make_nodes: Callable[..., list[str]]
) -> None:
    nodes, img = holder_setup(bed, make_nodes, core, namespace, "short")
    # No tag at all (":latest" implied), and the digest alone.
    by_short = create(core, namespace, pod(bed, "short", img))
    by_digest = create(core, namespace, pod(bed, "short", f"{img}@{DIGEST}"))
    assert bound_node(core, namespace, by_short) == nodes[1]
    assert bound_node(core, namespace, by_digest) == nodes[1]


def test_rollouts_created_together_join_the_pull_up_to_the_limit_then_spread(
    core: CoreV1Api, namespace: str, bed: Bed, make_nodes: Callable[..., list[str]]
) -> None:
    img = image(bed, "rollouts")
    nodes = make_nodes("roll", [{}, {}, {"unmanaged": True}, {}])
    pulling = nodes[2]
    # A pod of the new image bound to the unmanaged node: its pull is in progress.
    create(core, namespace, pod(bed, "roll", img, node_name=pulling))
    wait_for(
        lambda: bed.where(img)["pulling"] == [{"node": pulling, "pods": 1}],
        timeout=15,
        what="the extender to see the pull",
    )
    names = [create(core, namespace, pod(bed, "roll", img)) for _ in range(8)]
    placed = Counter(bound_node(core, namespace, n) for n in names)
    # Limit 4: three more join the pull (4 with the first), then the group
    # fills one other node to 4 and the last one goes to a third node.
    assert placed[pulling] == 3, placed
    assert sorted(placed.values()) == [1, 3, 4], placed


def test_default_scheduler_pods_are_unaffected(
    core: CoreV1Api, namespace: str, bed: Bed, make_nodes: Callable[..., list[str]]
) -> None:
    nodes, img = holder_setup(bed, make_nodes, core, namespace, "default")
    calls = bed.prioritize_calls()
    names = [
        create(core, namespace, pod(bed, "default", f"{img}:latest", scheduler=None))
        for _ in range(2)
    ]
    for n in names:
        # The default scheduler prefers the emptier nodes, and never asks us.
        assert bound_node(core, namespace, n) in (nodes[0], nodes[2])
        events = raw(
            core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={n}", _preload_content=False
            )
        )["items"]
        sources = {e.get("reportingComponent") or e["source"].get("component") for e in events}
        assert bed.scheduler_name not in sources
    assert bed.prioritize_calls() == calls


def test_pods_still_schedule_when_the_extender_is_down(
    core: CoreV1Api, namespace: str, bed: Bed, make_nodes: Callable[..., list[str]]
) -> None:
    nodes = make_nodes("down", [{}, {}])
    bed.extender.stop()
    try:
        name = create(core, namespace, pod(bed, "down", image(bed, "down")))
        assert bound_node(core, namespace, name) in nodes
    finally:
        bed.start_extender()
