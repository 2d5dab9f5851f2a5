"""Upgrading an in-cluster Sandman: no admission outage, running sandboxes keep serving.

A new version is applied the way an admin would (the same manifests naming
new image tags) while a client creates sandboxes without retrying; every
create must succeed, because the webhook rolls one new pod in before an old
one leaves (maxUnavailable 0, readiness only once its certificate, policy
and caches are loaded, a preStop pause while endpoints move). A sandbox
that ran before keeps its pod spec, hence its daemon, and keeps answering.
"""

from __future__ import annotations

import threading
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman import tokens
from sandman.contract import ANN_INJECTED, DAEMON_INIT_CONTAINER, LABEL_ID, LABEL_SANDBOX, NAMESPACE
from sandman.harness.cluster.incluster import InClusterDeployment
from sandman.harness.cluster.kwok_nodes import on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import raw
from sandman.harness.testing import wait_for, wait_ready
from sandman.install import apply as ap
from tests.e2e.test_incluster import incluster  # noqa: F401  (the fixture)
from tests.e2e.test_sandbox import call, namespace_key

# Creates the client must get through during the roll, at least: fewer would
# not show that admission stayed up while pods were replaced.
MIN_CREATES = 10


def _init_image(pod: dict[str, Any]) -> str:
    return next(
        c["image"] for c in pod["spec"]["initContainers"] if c["name"] == DAEMON_INIT_CONTAINER
    )


def test_upgrade_keeps_admission_up_and_running_sandboxes_serving(
    cluster: LocalCluster,
    incluster: InClusterDeployment,  # noqa: F811
    core: CoreV1Api,
    namespace: str,
    images: dict[str, str],
) -> None:
    old = incluster.version
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "before", "labels": {LABEL_SANDBOX: "true"}},
            "spec": {
                "nodeSelector": {"sandman.dev/node-kind": "real"},
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {"name": "main", "image": images["tiny"], "command": ["sleep", "3600"]}
                ],
            },
        },
    )
    before = wait_ready(core, namespace, "before", timeout=180)
    key = namespace_key(core, namespace)
    token = tokens.sandbox_token(key, before["metadata"]["labels"][LABEL_ID])
    ip = before["status"]["podIP"]
    assert call(ip, token, "/v1/exec", {"cmd": ["true"]})[0] == 200

    new = f"{old}-next"
    incluster.build_and_push(new)  # the same layers under new tags: a cheap "release"
    created, failures = [], []
    stop = threading.Event()

    def client() -> None:
        i = 0
        while not stop.is_set():
            name = f"during-{i:03d}"
            body = {
                "metadata": {"name": name, "labels": {LABEL_SANDBOX: "true"}},
                "spec": on_kwok(
                    {
                        "containers": [
                            {"name": "c", "image": images["tiny"], "command": ["sleep", "1"]}
                        ]
                    }
                ),
            }
            try:
                core.create_namespaced_pod(namespace, body)
                created.append(name)
            except ApiException as e:  # no retry: any refusal is an outage
                failures.append(f"{name}: {e.status} {e.body}")
            i += 1

    t = threading.Thread(target=client)
    t.start()
    try:
        docs = incluster.apply_version(new)
        ap.wait_available(incluster.kubectl, docs, progress=lambda _m: None)
    finally:
        stop.set()
        t.join(timeout=60)
    try:
        assert failures == [], failures[:3]
        assert len(created) >= MIN_CREATES, len(created)
        print(f"{len(created)} sandbox creates during the roll, none refused")
        # Every pod admitted during the roll has the daemon, from the old or the new image.
        for name in created:
            pod = core.read_namespaced_pod(name, namespace).to_dict()
            assert ANN_INJECTED in (pod["metadata"]["annotations"] or {}), name
        # The sandbox from before: same pod, same daemon, still answering.
        still = raw(core.read_namespaced_pod("before", namespace, _preload_content=False))
        assert still["metadata"]["uid"] == before["metadata"]["uid"]
        assert _init_image(still) == _init_image(before)
        assert _init_image(before).endswith(f":{old}")
        status, body = call(ip, token, "/v1/exec", {"cmd": ["echo", "still here"]})
        assert status == 200 and body["stdout"].strip() == "still here", body

        # New sandboxes get the new daemon once the old webhook pods are gone (a
        # terminating one answers through its preStop pause, with the old daemon).
        def only_new() -> bool:
            pods = incluster.webhook_pods(ready_only=False)
            return all(p["spec"]["containers"][0]["image"].endswith(f":{new}") for p in pods)

        wait_for(only_new, timeout=120, what="the old webhook pods to go")
        fresh = core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "after", "labels": {LABEL_SANDBOX: "true"}},
                "spec": on_kwok(
                    {"containers": [{"name": "c", "image": images["tiny"], "command": ["true"]}]}
                ),
            },
        )
        init = next(c for c in fresh.spec.init_containers if c.name == DAEMON_INIT_CONTAINER)
        assert init.image.endswith(f":{new}"), init.image
        webhook = incluster.webhook_pods()
        assert len(webhook) == 2
        for p in webhook:
            image = p["spec"]["containers"][0]["image"]
            assert image.endswith(f":{new}"), image
    finally:
        # Leave the session's cluster at the version it had.
        docs = incluster.apply_version(old)
        ap.wait_available(incluster.kubectl, docs, progress=lambda _m: None)
        assert {p["spec"]["containers"][0]["image"].rsplit(":", 1)[1]
                for p in incluster.webhook_pods()} == {old}, NAMESPACE  # fmt: skip
