"""Which rules govern a namespace the informer has not seen yet: read, never guessed.

Rules are selected by namespace labels, and a laxer default rule may sit
behind a stricter one for labelled namespaces. When the labels of a namespace
cannot be read, a sandbox there is refused with a retryable message instead of
being admitted under the default rule, and the failure is not remembered.
"""

from __future__ import annotations

from typing import Any

from sandman.contract import LABEL_SANDBOX
from sandman.kube_async import ApiError
from sandman.webhook.config import WebhookConfig
from sandman.webhook.metrics import WebhookMetrics
from sandman.webhook.review import parse_review, unknown_namespace_denial
from sandman.webhook.server import WebhookState, _namespace_labels_for


class FlakyClient:
    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.calls = 0

    async def get(self, _resource: Any, name: str, _namespace: str | None = None) -> Any:
        self.calls += 1
        if self.calls <= self.fail:
            raise ApiError(503, "the apiserver is busy")
        return {"metadata": {"name": name, "uid": "u-1", "labels": {"tier": "strict"}}}


def state(client: FlakyClient) -> WebhookState:
    return WebhookState(config=WebhookConfig(), client=client, metrics=WebhookMetrics.create())  # type: ignore[arg-type]


async def test_a_failed_read_is_not_remembered_as_no_labels() -> None:
    st = state(FlakyClient(fail=1))
    assert await _namespace_labels_for(st, "team") is False
    assert "team" not in st.extra_ns_labels
    assert await _namespace_labels_for(st, "team") is True  # asked again
    assert st.ns_labels("team") == {"tier": "strict"} and st.ns_uid("team") == "u-1"
    assert await _namespace_labels_for(st, "team") is True
    assert st.client.calls == 2  # a known namespace costs no further call


def review(op: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> Any:
    return parse_review(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u",
                "kind": {"kind": "Pod"},
                "operation": op,
                "namespace": "team",
                "object": obj,
                "oldObject": old,
            },
        }
    )


SANDBOX = {"metadata": {"labels": {LABEL_SANDBOX: "true"}}, "spec": {"containers": []}}
PLAIN = {"metadata": {}, "spec": {"containers": []}}


def test_a_sandbox_in_a_namespace_of_unknown_labels_is_refused_with_a_retry() -> None:
    out = unknown_namespace_denial(review("CREATE", SANDBOX))
    assert out is not None and not out.allowed and out.rule_ids == ["contract"]
    assert "team" in out.message and "retry" in out.message
    assert unknown_namespace_denial(review("UPDATE", SANDBOX, SANDBOX)) is not None
    assert unknown_namespace_denial(review("UPDATE", PLAIN, SANDBOX)) is not None


def test_pods_no_rule_governs_are_not_held_up() -> None:
    assert unknown_namespace_denial(review("CREATE", PLAIN)) is None
    assert unknown_namespace_denial(review("UPDATE", PLAIN, PLAIN)) is None
