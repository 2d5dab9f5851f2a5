"""`sandman eval run` on a cluster with no node dedicated to evaluations (a fresh
install), against the real apiserver and webhook, on kwok nodes.

- The shipped eval profile (it tolerates the dedicated nodes' taint and
  requires none), placed on the kwok nodes, this tier's only nodes: the run
  goes ahead on shared nodes, its pod is scheduled, and the deviation is
  recorded (run.json, the task's conditions, the summary). With a node
  labelled and tainted ``sandman.dev/dedicated=eval``, the runner pins the
  pods there and records that; a comparison of the two runs flags it.
- ``--require-dedicated`` with no such node: the command stops before it
  creates anything (no pod, no NetworkPolicy, no results) and prints the
  commands that dedicate a node.
- A profile that requires the label (the policy shipped before): refused up
  front with the same commands, where every task used to end
  ``infra_failed`` Unschedulable.

kwok nodes run no container, so a task here is not scored: it gets a node and
a Ready pod, then ends at the conditions check (no kubelet reports the image
it ran). Tasks scored on shared nodes are the e2e tier's (tests/e2e/test_eval.py).
"""

from __future__ import annotations

import asyncio
import copy
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import CoreV1Api, NetworkingV1Api

from sandman.bench.task_images import build_task_images
from sandman.client import SandmanClient
from sandman.eval.compare import compare
from sandman.eval.placement import PlacementRefused
from sandman.eval.results import ResultsDir
from sandman.eval.runner import EvalRun, Options
from sandman.eval.spec import parse_spec
from sandman.harness.cluster.kwok_nodes import (
    KWOK_NODE_PREFIX,
    KWOK_TOLERATION,
    NODE_KIND_LABEL,
    kwok_node_name,
)
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import api_client
from sandman.registry import RegistryClient
from tests.integration.test_eval import kwok_eval_policy, loopback_registry

ROOT = Path(__file__).resolve().parents[2]
KEY = "sandman.dev/dedicated"
SETUP = re.compile(
    r"kubectl label node (kwok-node-\d+) sandman\.dev/dedicated=eval && "
    r"kubectl taint node \1 sandman\.dev/dedicated=eval:NoSchedule"
)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    with loopback_registry(tmp_path) as host:
        yield host


def shipped_eval_profile() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "manifests" / "webhook" / "policy.yaml").read_text())
    rules = yaml.safe_load(doc["data"]["policy.yaml"])["rules"]
    base = next((r for r in rules if "namespaceSelector" not in r), rules[-1])
    return dict(base["profiles"]["eval"])


def on_kwok(profile: dict[str, Any]) -> dict[str, Any]:
    """The profile, placed on kwok nodes (also tolerating their taint)."""
    p = copy.deepcopy(profile)
    p["nodeSelector"] = {**(p.get("nodeSelector") or {}), NODE_KIND_LABEL: "kwok"}
    p["tolerations"] = [*(p.get("tolerations") or []), KWOK_TOLERATION]
    return p


def spec_yaml(ref: str, *, network: bool) -> str:
    task = {"id": "t1", "image": ref, "network": network, "test": {"command": "true"},
            "resources": {"cpu": "100m", "memory": "64Mi"}}  # fmt: skip
    return yaml.safe_dump({"name": "placement", "tasks": [task]})


@contextmanager
def dedicated(core: CoreV1Api, name: str, *, tainted: bool = True) -> Iterator[None]:
    """Node ``name`` labelled and tainted sandman.dev/dedicated=eval, as docs/eval.md
    says (``tainted=False``: only labelled, which does not make it dedicated)."""
    original = core.read_node(name).spec.taints or []
    taints = [t.to_dict() for t in original]
    taint = [{"key": KEY, "value": "eval", "effect": "NoSchedule"}] if tainted else []
    core.patch_node(name, {"metadata": {"labels": {KEY: "eval"}}, "spec": {"taints": [
        *[{k: v for k, v in t.items() if v is not None} for t in taints], *taint]}})  # fmt: skip
    try:
        yield
    finally:
        core.patch_node(name, {"metadata": {"labels": {KEY: None}}, "spec": {"taints": [
            {k: v for k, v in t.items() if v is not None} for t in taints]}})  # fmt: skip


async def run(cluster: LocalCluster, namespace: str, spec_text: str, out: Path, **opts: Any) -> Any:
    spec = parse_spec(spec_text.encode(), name="placement", jsonl=False)
    options = Options(namespace=namespace, attempts=1, start_timeout_s=120, **opts)
    # Through the apiserver: kwok pods have no daemon to ask, only Ready counts.
    async with (
        SandmanClient(kubeconfig=cluster.kubeconfig, namespace=namespace,
                      transport="proxy") as client,
        RegistryClient() as rc,
    ):  # fmt: skip
        return await EvalRun(client, spec, ResultsDir(out), options, registry=rc).run()


async def test_without_dedicated_nodes_the_run_is_placed_on_shared_ones_and_says_so(
    cluster: LocalCluster, core: CoreV1Api, namespace: str, registry: str, tmp_path: Path
) -> None:
    (ref,) = await asyncio.to_thread(build_task_images, registry, ["shared"], layer_mb=0.01)
    text = spec_yaml(ref, network=True)
    with kwok_eval_policy(cluster, core, namespace, registry, on_kwok(shipped_eval_profile())):
        shared = await run(cluster, namespace, text, tmp_path / "shared")
        node = kwok_node_name(0)
        with dedicated(core, node):
            pinned = await run(cluster, namespace, text, tmp_path / "dedicated")
        # Required, nodes not looked at first (an autoscaler's case): pinned to
        # the label, and the node it got is checked: labelled is not dedicated.
        with dedicated(core, node, tainted=False):
            unchecked = await run(cluster, namespace, text, tmp_path / "unchecked",
                                  require_dedicated=True, check_nodes=False)  # fmt: skip

    (rec,) = shared.records
    c = rec["conditions"]
    # Scheduled (not Unschedulable, not a start Timeout): the pod got a node.
    assert rec["reason"] not in ("Unschedulable", "Timeout"), rec
    assert str(c.get("node")).startswith(KWOK_NODE_PREFIX) and "schedule_s" in rec["phases"], rec
    assert c["dedicated_node"] is False and c["placement"] == "shared", c
    assert KEY not in c["node_selector"]
    why = "no node is labelled sandman.dev/dedicated=eval (dedicated to profile 'eval')"
    assert c["placement_reason"] == why
    placement = ResultsDir(tmp_path / "shared").load_run()["placement"]
    assert placement["dedicated_nodes"] is False and placement["verdict"] == "shared"
    assert placement["reason"] == why and SETUP.search(placement["fix"]), placement
    assert len(placement["nodes"]) >= 3 and placement["pinned"] == {}
    assert shared.summary["conditions"]["dedicated_nodes"] is False
    assert f"dedicated nodes: no: 1 of 1 tasks ran on shared nodes ({why})" in shared.text

    (rec,) = pinned.records
    c = rec["conditions"]
    assert c["node"] == node and c["dedicated_node"] is True and c["placement"] == "dedicated"
    assert c["node_selector"][KEY] == "eval", c
    placement = ResultsDir(tmp_path / "dedicated").load_run()["placement"]
    assert placement["dedicated_nodes"] is True and placement["nodes"] == [node]
    assert placement["pinned"] == {KEY: "eval"}
    assert pinned.summary["conditions"]["dedicated_nodes"] is True
    differ = compare(shared.records, pinned.records)
    assert differ["conditions_differ"] and differ["dedicated_nodes_a"] is False

    (rec,) = unchecked.records
    c = rec["conditions"]
    assert c["node"] == node and c["node_selector"][KEY] == "eval", c
    assert c["dedicated_node"] is False and rec["status"] == "infra_failed"
    assert rec["reason"] == "ConditionsNotMet" and rec["score"] is None
    assert f"node {node} is not dedicated to profile 'eval'" in rec["message"], rec
    assert "--skip-node-check was given" in unchecked.run["placement"]["reason"]


def _nothing_created(core: CoreV1Api, cluster: LocalCluster, namespace: str) -> None:
    assert core.list_namespaced_pod(namespace).items == []
    net = NetworkingV1Api(api_client(cluster.kubeconfig))
    assert net.list_namespaced_network_policy(namespace).items == []


def test_require_dedicated_stops_before_creating_anything(
    cluster: LocalCluster, core: CoreV1Api, namespace: str, registry: str, tmp_path: Path
) -> None:
    (ref,) = build_task_images(registry, ["required"], layer_mb=0.01)
    spec_file = tmp_path / "placement.yaml"
    spec_file.write_text(spec_yaml(ref, network=False))  # offline: its policies come first
    out = tmp_path / "out"
    with kwok_eval_policy(cluster, core, namespace, registry, on_kwok(shipped_eval_profile())):
        proc = subprocess.run(
            [sys.executable, "-m", "sandman.cli.main", "eval", "run", str(spec_file), "-o",
             str(out), "-n", namespace, "--kubeconfig", str(cluster.kubeconfig),
             "--require-dedicated"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        _nothing_created(core, cluster, namespace)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith(
        "sandman eval run: refused: --require-dedicated: no node is labelled "
        "sandman.dev/dedicated=eval"
    ), proc.stderr
    assert SETUP.search(proc.stderr), proc.stderr
    assert "or run without --require-dedicated" in proc.stderr
    assert not out.exists()


async def test_a_profile_that_requires_dedicated_nodes_is_refused_up_front(
    cluster: LocalCluster, core: CoreV1Api, namespace: str, registry: str, tmp_path: Path
) -> None:
    (ref,) = await asyncio.to_thread(build_task_images, registry, ["strict"], layer_mb=0.01)
    strict = on_kwok(shipped_eval_profile())
    strict["nodeSelector"][KEY] = "eval"
    with kwok_eval_policy(cluster, core, namespace, registry, strict):
        with pytest.raises(PlacementRefused) as e:
            await run(cluster, namespace, spec_yaml(ref, network=False), tmp_path / "strict")
        _nothing_created(core, cluster, namespace)
    msg = str(e.value)
    assert msg.startswith("no node can run the tasks' pods of profile 'eval': kwok-node-"), msg
    assert "not labelled sandman.dev/dedicated=eval (the profile's nodeSelector)" in msg
    assert SETUP.search(msg) and "remove nodeSelector sandman.dev/dedicated" in msg
    assert not (tmp_path / "strict").exists()
