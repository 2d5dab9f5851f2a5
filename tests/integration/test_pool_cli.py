"""`sandman pool ...` and `sandman claim` as a kubectl user runs them: real
processes against the real apiserver, with the pool's pods on kwok nodes
(simulated: they become Ready without a container ever running)."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client import CoreV1Api

from sandman.cli.common import EXIT_SANDMAN
from sandman.contract import ANN_EXPIRES_AT, LABEL_STATE, parse_time
from sandman.harness.cluster.components import KWOK_NODE_ANNOTATION
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, NODE_KIND_LABEL
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import raw
from sandman.harness.testing import wait_for
from sandman.pools.spec import ANN_CLAIMED_BY, pool_selector

ON_KWOK = (
    f"--node-selector={NODE_KIND_LABEL}=kwok",
    f"--toleration={KWOK_NODE_ANNOTATION}=fake:NoSchedule",
)
Sandman = Callable[..., subprocess.CompletedProcess[str]]


def argv(cluster: LocalCluster, namespace: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sandman.cli.main",
        *args,
        f"--kubeconfig={cluster.kubeconfig}",
        f"--namespace={namespace}",
    ]


@pytest.fixture
def sandman(cluster: LocalCluster, namespace: str) -> Sandman:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv(cluster, namespace, *args), capture_output=True, text=True, timeout=120
        )

    return run


def pool_row(sandman: Sandman, name: str) -> dict[str, Any] | None:
    r = sandman("pool", "ls", "--json")
    assert r.returncode == 0, r.stderr
    return next((row for row in json.loads(r.stdout) if row["name"] == name), None)


def wait_pool(sandman: Sandman, name: str, what: str, **want: int) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        row = pool_row(sandman, name)
        return row if row and all(row[k] == v for k, v in want.items()) else None

    return wait_for(check, timeout=90, what=f"pool {name}: {what}")


def pods(core: CoreV1Api, ns: str, selector: str) -> list[dict[str, Any]]:
    doc = raw(core.list_namespaced_pod(ns, label_selector=selector, _preload_content=False))
    return list(doc["items"])


def test_claims_refill_and_survive_pool_delete(
    cluster: LocalCluster, namespace: str, core: CoreV1Api, sandman: Sandman
) -> None:
    r = sandman("pool", "create", "p1", f"--image={KWOK_IMAGE}", "--size=3", "--ttl=1h", *ON_KWOK)
    assert r.returncode == 0, r.stderr
    row = wait_pool(sandman, "p1", "3 idle pods Ready", ready=3)
    assert (row["size"], row["image"], row["condition"]) == (3, KWOK_IMAGE, "Healthy")

    again = sandman("pool", "create", "p1", f"--image={KWOK_IMAGE}")
    assert again.returncode == EXIT_SANDMAN
    assert "already exists" in again.stderr and "sandman pool scale p1" in again.stderr

    # Twice as many claimers as idle pods: each must win a pod of its own, the
    # later ones once the ReplicaSet has refilled.
    procs = [
        subprocess.Popen(
            argv(cluster, namespace, "claim", "p1", "--wait=30", f"--claimer=t{i}", "-o", "json"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    results = [(p.communicate(timeout=120), p.returncode) for p in procs]
    for (_, err), code in results:
        assert code == 0, err
    claims = [json.loads(out) for (out, _), _ in results]
    names = [c["name"] for c in claims]
    assert len(set(names)) == 6, names

    now = dt.datetime.now(dt.UTC)
    for i, name in enumerate(names):
        pod = raw(core.read_namespaced_pod(name, namespace, _preload_content=False))
        md = pod["metadata"]
        assert md["labels"][LABEL_STATE] == "claimed"
        assert not md.get("ownerReferences"), md.get("ownerReferences")
        assert md["annotations"][ANN_CLAIMED_BY] == f"t{i}"
        # No --ttl on the claim: the lease is the pool's (1h), from the claim on.
        left = parse_time(md["annotations"][ANN_EXPIRES_AT]) - now
        assert dt.timedelta(minutes=55) < left <= dt.timedelta(hours=1), left
        assert any(
            c["type"] == "Ready" and c["status"] == "True" for c in pod["status"]["conditions"]
        )

    wait_pool(sandman, "p1", "refilled to 3, 6 claimed", ready=3, claimed=6)
    table = sandman("pool", "ls")
    assert table.returncode == 0, table.stderr
    assert "IDLE-READY" in table.stdout.splitlines()[0] and "p1" in table.stdout

    r = sandman("pool", "delete", "p1")
    assert r.returncode == 0, r.stderr
    wait_for(
        lambda: not pods(core, namespace, pool_selector("p1")),
        timeout=60,
        what="the idle pods deleted with the pool",
    )
    assert pool_row(sandman, "p1") is None
    left_over = {p["metadata"]["name"]: p for p in pods(core, namespace, pool_selector("p1", None))}
    assert set(left_over) == set(names)
    assert not any(p["metadata"].get("deletionTimestamp") for p in left_over.values())


def test_claim_without_a_pod_to_claim_fails_clearly(
    cluster: LocalCluster, namespace: str, sandman: Sandman
) -> None:
    r = sandman("claim", "nope", "--wait=1")
    assert r.returncode == EXIT_SANDMAN and r.stdout == ""
    assert f"no pool nope in namespace {namespace}" in r.stderr
    assert "sandman pool create" in r.stderr
    for verb in (("scale", "nope", "2"), ("delete", "nope")):
        r = sandman("pool", *verb)
        assert r.returncode == EXIT_SANDMAN and "no pool nope" in r.stderr, verb

    r = sandman("pool", "create", "Bad_Name", f"--image={KWOK_IMAGE}")
    assert r.returncode == EXIT_SANDMAN and "lower-case" in r.stderr

    r = sandman("pool", "create", "p0", f"--image={KWOK_IMAGE}", "--size=1", *ON_KWOK)
    assert r.returncode == 0, r.stderr
    wait_pool(sandman, "p0", "1 idle pod Ready", ready=1)
    r = sandman("pool", "scale", "p0", "0")
    assert r.returncode == 0, r.stderr
    wait_pool(sandman, "p0", "scaled to 0", size=0, ready=0, starting=0)

    r = sandman("claim", "p0", "--wait=1")
    assert r.returncode == EXIT_SANDMAN and r.stdout == ""
    assert "pool p0 has no idle pod" in r.stderr and "size 0" in r.stderr, r.stderr
