"""Only the apiserver gets reviews answered, and no Event comes from one that
changed nothing: the real apiserver (its AdmissionConfiguration presents the
harness's admission client certificate) and the real webhook.

Nothing-happened checks do not sleep: Events go out in order through one
queue, so once the Event of a later, real denial is there, an Event for the
earlier request would be there too.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.contract import ANN_INJECTED, REASON_POLICY_DENIED
from sandman.harness.cluster import admission
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import raw
from sandman.harness.probes import insecure_context
from sandman.harness.testing import wait_for
from tests.integration.test_webhook import create, sandbox_pod

DENIED_IMAGE = "docker.io/library/evil:1"  # the local policy allows 127.0.0.1:5000/* only


def denied_pod(name: str) -> dict[str, Any]:
    pod = sandbox_pod(name)
    pod["spec"]["containers"][0]["image"] = DENIED_IMAGE
    return pod


def review(namespace: str, pod: dict[str, Any], *, object_namespace: str) -> dict[str, Any]:
    """A CREATE review shaped as the apiserver sends it."""
    obj = {**pod, "metadata": {**pod["metadata"], "namespace": object_namespace}}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "5d1c0ffe-0000-4000-8000-000000000001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:attacker:default"},
            "object": obj,
            "dryRun": False,
        },
    }


def post(url: str, body: dict[str, Any], ctx: ssl.SSLContext) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def apiserver_context(cluster: LocalCluster) -> ssl.SSLContext:
    ctx = insecure_context()
    ctx.load_cert_chain(*admission.client_cert(cluster.layout.pki))
    return ctx


def webhook_url(cluster: LocalCluster) -> str:
    deployment = cluster.deployment
    assert deployment is not None, "the session deploys Sandman"
    return deployment.webhook_url


def events_on(core: CoreV1Api, namespace: str, name: str) -> list[dict[str, Any]]:
    items = raw(core.list_namespaced_event(namespace, _preload_content=False))["items"]
    return [
        e
        for e in items
        if e["reason"] == REASON_POLICY_DENIED and e["involvedObject"]["name"] == name
    ]


def deny_for_real(core: CoreV1Api, namespace: str) -> None:
    """A denial through the apiserver, and its Event (the queue's marker)."""
    with pytest.raises(ApiException) as e:
        create(core, namespace, denied_pod("real"))
    assert e.value.status == 403
    wait_for(lambda: events_on(core, namespace, "real"), what="the real denial's Event")


def test_a_review_without_the_apiservers_certificate_is_refused_and_writes_no_event(
    cluster: LocalCluster, core: CoreV1Api, namespace: str
) -> None:
    forged = review(namespace, denied_pod("forged"), object_namespace=namespace)
    for endpoint in ("mutate", "validate"):
        status, body = post(f"{webhook_url(cluster)}/{endpoint}", forged, insecure_context())
        assert status == 403 and "no client certificate" in body["error"], body
    deny_for_real(core, namespace)
    assert events_on(core, namespace, "forged") == []


def test_the_apiserver_is_answered_and_a_forged_namespace_is_not(
    cluster: LocalCluster, core: CoreV1Api, namespace: str
) -> None:
    # Through the apiserver, as before: created and injected.
    pod = create(core, namespace, sandbox_pod("ok"))
    assert ANN_INJECTED in pod["metadata"]["annotations"]
    # With the apiserver's certificate, a review naming one namespace for an
    # object of another (a caller choosing the rules) is refused, undecided.
    ctx = apiserver_context(cluster)
    url = f"{webhook_url(cluster)}/validate"
    status, body = post(url, review("default", denied_pod("x"), object_namespace=namespace), ctx)
    assert status == 400 and "differs from request.namespace 'default'" in body["error"], body
    # The same review made consistent is decided (denied: the image).
    status, body = post(url, review(namespace, denied_pod("x"), object_namespace=namespace), ctx)
    assert status == 200 and body["response"]["allowed"] is False, body


def test_a_server_dry_run_of_a_denied_sandbox_writes_no_event(
    core: CoreV1Api, namespace: str
) -> None:
    with pytest.raises(ApiException) as e:
        create(core, namespace, denied_pod("dry"), dry_run="All")
    assert e.value.status == 403 and "[registry]" in e.value.body
    deny_for_real(core, namespace)
    assert events_on(core, namespace, "dry") == []
