"""Sandman installed in-cluster on the real node: the path a user's cluster takes.

The session cluster runs Sandman in-cluster whenever the real node is there
(images built without Docker, pushed to the node's registry, the local
overlay of manifests/ applied with kubectl; harness/cluster/incluster.py).
These tests use only what a user has: kubectl, the Services, the pods.
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import AppsV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman import tokens
from sandman.contract import (
    ANN_EXPIRES_AT,
    ANN_INJECTED,
    ANN_TTL,
    DAEMON_INIT_CONTAINER,
    LABEL_ID,
    LABEL_SANDBOX,
    NAMESPACE,
    REASON_LEASE_EXPIRED,
    SCHEDULER_NAME,
)
from sandman.harness.cluster.incluster import InClusterDeployment
from sandman.harness.cluster.kwok_nodes import on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.kube import api_client, raw
from sandman.harness.testing import wait_for, wait_ready
from tests.e2e.test_sandbox import call, namespace_key

DEPLOYMENTS = ("sandman-webhook", "sandman-reaper", "sandman-scheduler")
BURST = 50


@pytest.fixture(scope="module")
def incluster(cluster: LocalCluster, real_node: RealNode) -> InClusterDeployment:
    deployment = cluster.deployment
    if not isinstance(deployment, InClusterDeployment):
        pytest.skip(f"Sandman runs as {cluster.config.sandman_mode} here, not in-cluster")
    return deployment


@pytest.fixture(scope="module")
def apps(cluster: LocalCluster) -> AppsV1Api:
    return AppsV1Api(api_client(cluster.kubeconfig))


def kubectl(cluster: LocalCluster, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        [str(cluster.binaries.kubectl), f"--kubeconfig={cluster.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def metric_sum(urls: list[str], name: str) -> float:
    import urllib.request

    from sandman.harness.probes import insecure_context

    total = 0.0
    for url in urls:
        with urllib.request.urlopen(url, context=insecure_context(), timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith((name + " ", name + "{")):
                    total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture
def reaper_for(
    incluster: InClusterDeployment, apps: AppsV1Api, cluster: LocalCluster, namespace: str
) -> Iterator[None]:
    """The in-cluster reaper (2 replicas, leader-elected) for this test's namespace
    only: test sessions keep it at 0 so that tests with reapers of their own
    are alone."""
    dep = apps.read_namespaced_deployment("sandman-reaper", NAMESPACE)
    original_args = list(dep.spec.template.spec.containers[0].args or [])
    patch = {
        "spec": {
            "replicas": 2,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "reaper",
                            "args": [*original_args, f"--watch-namespace={namespace}"],
                        }
                    ]
                }
            },
        }
    }
    apps.patch_namespaced_deployment("sandman-reaper", NAMESPACE, patch)
    kubectl(cluster, "-n", NAMESPACE, "rollout", "status", "deployment/sandman-reaper",
            "--timeout=180s")  # fmt: skip
    yield
    restore = {
        "spec": {
            "replicas": dep.spec.replicas,
            "template": {"spec": {"containers": [{"name": "reaper", "args": original_args}]}},
        }
    }
    apps.patch_namespaced_deployment("sandman-reaper", NAMESPACE, restore)


def test_every_sandman_deployment_is_available(incluster: InClusterDeployment, apps: AppsV1Api):
    for name in DEPLOYMENTS:
        dep = raw(apps.read_namespaced_deployment(name, NAMESPACE, _preload_content=False))
        conds = {c["type"]: c["status"] for c in dep["status"].get("conditions", [])}
        assert conds.get("Available") == "True", (name, dep["status"])
        want = dep["spec"]["replicas"]
        assert dep["status"].get("availableReplicas", 0) == want, (name, dep["status"])
    # The apiserver reaches the webhook through its Service: a ClusterIP with two endpoints.
    assert len(incluster.webhook_pods()) == 2


def test_kubectl_sandbox_is_injected_scheduled_served_and_reaped_in_cluster(
    cluster: LocalCluster,
    incluster: InClusterDeployment,
    core: CoreV1Api,
    namespace: str,
    images: dict[str, str],
    reaper_for: None,
) -> None:
    # Nothing of Sandman runs on the host in this mode.
    host = {p.name for p in cluster.processes()}
    assert not host & {"sandman-webhook", "sandman-reaper", "sandman-extender", SCHEDULER_NAME}
    admissions = metric_sum(incluster.metrics_urls("webhook"), "sandman_webhook_admissions_total")
    placements = metric_sum(incluster.metrics_urls("extender"), "sandman_extender_placements_total")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "kubectl-made",
            "labels": {LABEL_SANDBOX: "true"},
            "annotations": {ANN_TTL: "40s"},
        },
        "spec": {
            "nodeSelector": {"sandman.dev/node-kind": "real"},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": images["tiny"],
                    "command": ["httpd", "-f", "-p", "8080", "-h", "/www"],
                }
            ],
        },
    }
    kubectl(cluster, "-n", namespace, "create", "-f", "-", stdin=json.dumps(pod))
    got = wait_ready(core, namespace, "kubectl-made", timeout=180)
    # Injected by the in-cluster webhook ...
    assert ANN_INJECTED in got["metadata"]["annotations"]
    assert got["spec"]["initContainers"][0]["name"] == DAEMON_INIT_CONTAINER
    assert (
        metric_sum(incluster.metrics_urls("webhook"), "sandman_webhook_admissions_total")
        > admissions
    )
    # ... scheduled by sandman-scheduler, which asked the in-cluster extender.
    assert got["spec"]["schedulerName"] == SCHEDULER_NAME
    events = raw(core.list_namespaced_event(namespace, _preload_content=False))["items"]
    scheduled = [e for e in events if e["reason"] == "Scheduled"]
    assert scheduled and (
        scheduled[0].get("reportingComponent") == SCHEDULER_NAME
        or scheduled[0]["source"].get("component") == SCHEDULER_NAME
    ), scheduled
    # The scheduler asks its extender only when more than one node fits (the
    # real node is the only one for this pod): a second sandbox, for the kwok
    # nodes, shows the in-cluster extender scoring.
    kwok = {"apiVersion": "v1", "kind": "Pod", **_sandbox("kubectl-made-kwok", images["tiny"])}
    kubectl(cluster, "-n", namespace, "create", "-f", "-", stdin=json.dumps(kwok))

    def bound() -> bool:
        return bool(core.read_namespaced_pod("kubectl-made-kwok", namespace).spec.node_name)

    wait_for(bound, timeout=60, what="sandman-scheduler binding the kwok sandbox")
    wait_for(
        lambda: (
            metric_sum(incluster.metrics_urls("extender"), "sandman_extender_placements_total")
            > placements
        ),
        timeout=30,
        what="the extender counting the placement",
    )
    # ... answers commands with its token ...
    key = namespace_key(core, namespace)
    token = tokens.sandbox_token(key, got["metadata"]["labels"][LABEL_ID])
    status, body = call(got["status"]["podIP"], token, "/v1/exec", {"cmd": ["echo", "in-cluster"]})
    assert status == 200 and body["stdout"].strip() == "in-cluster", body
    # ... and is reclaimed by the in-cluster reaper at the end of its lease.
    expires = got["metadata"]["annotations"][ANN_EXPIRES_AT]

    def gone() -> bool:
        try:
            core.read_namespaced_pod("kubectl-made", namespace)
        except ApiException as e:
            return e.status == 404
        return False

    wait_for(gone, timeout=150, what=f"the reaper reclaiming the sandbox (lease to {expires})")
    events = raw(core.list_namespaced_event(namespace, _preload_content=False))["items"]
    reaped = [e for e in events if e["reason"] == REASON_LEASE_EXPIRED]
    assert reaped and reaped[0]["source"]["component"] == "sandman-reaper", reaped


def _sandbox(name: str, kwok_image: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {LABEL_SANDBOX: "true"}},
        "spec": on_kwok(
            {"containers": [{"name": "main", "image": kwok_image, "command": ["sleep", "3600"]}]}
        ),
    }


def _create_retrying(core: CoreV1Api, namespace: str, body: dict[str, Any]) -> int:
    """Create like a client would (the SDK's rule): a create refused because the
    webhook could not be called is retried; returns the retries it took."""
    for attempt in range(30):
        try:
            core.create_namespaced_pod(namespace, body)
            return attempt
        except ApiException as e:
            if e.status == 409:  # an earlier attempt landed after all
                return attempt
            if e.status >= 500 and "failed calling webhook" in (e.body or ""):
                time.sleep(0.2 * (attempt + 1))
                continue
            raise
    raise AssertionError(f"{body['metadata']['name']}: still refused after 30 attempts")


def test_killing_the_serving_webhook_pod_during_a_burst_loses_nothing(
    incluster: InClusterDeployment, core: CoreV1Api, namespace: str, images: dict[str, str]
) -> None:
    pods = incluster.webhook_pods()
    assert len(pods) == 2
    before = {
        p["metadata"]["name"]: metric_sum(
            [f"https://{p['status']['podIP']}:8443/metrics"], "sandman_webhook_admissions_total"
        )
        for p in pods
    }
    names = [f"burst-{i:02d}" for i in range(BURST)]
    killed: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        futures = [
            pool.submit(_create_retrying, core, namespace, _sandbox(n, images["tiny"]))
            for n in names
        ]

        def serving() -> str | None:
            # The replica that has answered admissions of this burst.
            for p in pods:
                url = f"https://{p['status']['podIP']}:8443/metrics"
                try:
                    now = metric_sum([url], "sandman_webhook_admissions_total")
                except OSError:
                    continue
                if now > before[p["metadata"]["name"]]:
                    return str(p["metadata"]["name"])
            return None

        victim = wait_for(serving, timeout=60, what="a webhook pod serving the burst")
        core.delete_namespaced_pod(victim, NAMESPACE, grace_period_seconds=0)
        killed.append(victim)
        retries = [f.result(timeout=300) for f in futures]
    listed = raw(core.list_namespaced_pod(namespace, _preload_content=False))["items"]
    by_name = {p["metadata"]["name"]: p for p in listed}
    assert sorted(by_name) == names, set(names) ^ set(by_name)  # none lost, none extra
    without = [
        n
        for n, p in by_name.items()
        if ANN_INJECTED not in (p["metadata"].get("annotations") or {})
        or not any(c["name"] == DAEMON_INIT_CONTAINER for c in p["spec"].get("initContainers", []))
    ]
    assert without == [], f"admitted without the daemon: {without}"
    print(f"killed {killed[0]}; creates retried {sum(retries)} times in all")
    # The Deployment heals: two Ready webhook pods again.
    wait_for(lambda: len(incluster.webhook_pods()) == 2, timeout=180, what="a new webhook pod")
