"""kwok nodes that model image pulls: a pod on a node without its image is Ready
later than one on a node that holds it (harness/cluster/kwok_pull.py).

Real parts: the apiserver, a second kwok process with our Stage, the
simulator's watch and patches. Nothing asserts a speed: the modelled wait is
5 s, and the checks are orderings and lower bounds, which load only widens.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from pathlib import Path
from typing import Any

from sandman.harness.cluster.kwok_pull import PULL_MS, READY_AT, PullNodes
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.pullmodel import PullModel
from sandman.harness.testing import free_port
from sandman.kube_async import PODS, KubeClient

IMAGE = "127.0.0.1:5000/sandman/task:kwok-pull-test"
SIZE = 500_000_000
RATE = 100_000_000  # 500 MB at 100 MB/s: 5 s on the node without it
WAIT_S = 120  # bounds a hang, never a speed


def _pod(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,  # placed by hand: this test is about the node, not the scheduler
            "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "infinity"]}],
        },
    }


def _ready_at(pod: dict[str, Any]) -> dt.datetime | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c["type"] == "Ready" and c["status"] == "True":
            return dt.datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00"))
    return None


async def test_a_pod_on_a_node_without_its_image_is_ready_later(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    tid = uuid.uuid4().hex[:6]
    cold, warm = f"pull-{tid}-cold", f"pull-{tid}-warm"
    model = PullModel(rate_bytes_per_s=RATE, sizes={IMAGE: SIZE})
    async with (
        KubeClient.from_kubeconfig(cluster.kubeconfig) as kube,
        PullNodes(
            kube,
            kwok=cluster.binaries.kwok,
            kubeconfig=cluster.layout.kubeconfig("kwok"),
            work_dir=tmp_path,
            port=free_port(),
            names=[cold, warm],
            model=model,
            clock=time.time,
            images={warm: [IMAGE]},
        ),
    ):
        for node in (cold, warm):
            await kube.create(PODS, _pod(node, node), namespace)

        async def both_ready() -> dict[str, dict[str, Any]] | None:
            pods = {n: await kube.get(PODS, n, namespace) for n in (cold, warm)}
            return pods if all(_ready_at(p) for p in pods.values()) else None

        async with asyncio.timeout(WAIT_S):
            while (pods := await both_ready()) is None:
                await asyncio.sleep(0.2)

        # The model's verdicts: a full pull on one node, none on the other.
        ann = {n: p["metadata"]["annotations"] for n, p in pods.items()}
        assert float(ann[warm][PULL_MS]) <= 0
        assert float(ann[cold][PULL_MS]) >= SIZE / RATE * 1000 - 1
        # kwok kept the cold pod Pending until the modelled pull ended...
        cold_ready, warm_ready = _ready_at(pods[cold]), _ready_at(pods[warm])
        assert cold_ready is not None and warm_ready is not None
        promised = dt.datetime.fromisoformat(ann[cold][READY_AT].replace("Z", "+00:00"))
        # (conditions carry whole seconds: compare at that resolution)
        assert cold_ready >= promised.replace(microsecond=0)
        # ...so it was Ready later than the pod on the node holding the image.
        assert cold_ready > warm_ready
        # Once pulled, the node holds it: a second pod there pays nothing.
        await kube.create(PODS, _pod(f"{cold}-again", cold), namespace)
        async with asyncio.timeout(WAIT_S):
            while _ready_at(again := await kube.get(PODS, f"{cold}-again", namespace)) is None:
                await asyncio.sleep(0.2)
        assert float(again["metadata"]["annotations"][PULL_MS]) <= 0
