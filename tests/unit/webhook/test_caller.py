"""Which callers and which reviews the webhook answers (webhook/caller.py).

Each case is a review the apiserver could not have sent, built from one it
could by changing one field; the comment says which rule refuses it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sandman.webhook.caller import authenticate, common_name, inconsistency

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"}}


def review(**req: Any) -> dict[str, Any]:
    """A CREATE of a pod in "team", as the apiserver sends it; ``req`` overrides."""
    request: dict[str, Any] = {
        "uid": "0f1e",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team",
        "operation": "CREATE",
        "userInfo": {"username": "alice"},
        "object": copy.deepcopy(POD),
    }
    request.update(req)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def in_ns(ns: str) -> dict[str, Any]:
    pod = copy.deepcopy(POD)
    pod["metadata"]["namespace"] = ns
    return pod


def test_what_the_apiserver_sends_passes() -> None:
    assert inconsistency(review()) is None
    # An UPDATE carries both objects, in the request's namespace.
    assert inconsistency(review(operation="UPDATE", oldObject=in_ns("team"))) is None
    # kubectl debug: the ephemeralcontainers subresource carries the Pod.
    assert (
        inconsistency(
            review(operation="UPDATE", subResource="ephemeralcontainers", oldObject=in_ns("team"))
        )
        is None
    )
    # A DELETE has only the old object.
    assert inconsistency(review(operation="DELETE", object=None, oldObject=in_ns("team"))) is None


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        # A forged namespace to pick another namespace's rules: the object says "team".
        ({"namespace": "other"}, "differs from request.namespace 'other'"),
        # The object claims another namespace than the request path.
        ({"object": in_ns("other")}, "request.object.metadata.namespace 'other'"),
        # No namespace on the object at all: the apiserver always fills it in.
        ({"object": {"kind": "Pod", "metadata": {"name": "p"}}}, "'' differs"),
        # An UPDATE whose old object lives elsewhere.
        (
            {"operation": "UPDATE", "oldObject": in_ns("other")},
            "request.oldObject.metadata.namespace 'other'",
        ),
        # An UPDATE without the old object.
        ({"operation": "UPDATE"}, "request.oldObject is missing"),
        # An empty request namespace (pods are namespaced).
        ({"namespace": ""}, "request.namespace is empty"),
        # Nobody asked: the apiserver always names the user.
        ({"userInfo": {}}, "userInfo.username is empty"),
        ({"userInfo": None}, "userInfo.username is empty"),
        ({"uid": ""}, "request.uid is empty"),
        # A kind that does not belong to the resource.
        (
            {"kind": {"group": "", "version": "v1", "kind": "Secret"}},
            "request.kind 'Secret' does not belong",
        ),
        # A resource the webhook is not registered for.
        (
            {"resource": {"group": "", "version": "v1", "resource": "secrets"}},
            "core/secrets is not one",
        ),
        ({"subResource": "exec"}, "core/pods/exec is not one"),
        ({"operation": "CONNECT"}, "'CONNECT' is not one"),
    ],
)
def test_a_review_the_apiserver_could_not_send_is_refused(
    change: dict[str, Any], rule: str
) -> None:
    why = inconsistency(review(**change))
    assert why is not None and rule in why, why


# What ssl.SSLSocket.getpeercert() returns for a verified client certificate.
PEER = {"subject": ((("organizationName", "x"),), (("commonName", "kube-apiserver"),))}


def test_authentication() -> None:
    assert common_name(PEER) == "kube-apiserver"
    assert common_name({}) == "" and common_name(None) == ""
    # No client CA configured: nobody is asked for a certificate.
    assert authenticate(None, required=False) is None
    # With one: no certificate (None, or {} when the client sent none) is refused.
    assert "no client certificate" in (authenticate(None, required=True) or "")
    assert "no client certificate" in (authenticate({}, required=True) or "")
    assert authenticate(PEER, required=True) is None
    # An allowed-CN list narrows the CA's certificates to the apiserver's.
    assert authenticate(PEER, required=True, allowed_cns=("kube-apiserver",)) is None
    refused = authenticate(PEER, required=True, allowed_cns=("other",))
    assert refused is not None and "'kube-apiserver'" in refused
