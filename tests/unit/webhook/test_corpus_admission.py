"""The admission corpus through the pure decision functions, as the apiserver chains them:
mutation, then validation of the mutated pod; for an UPDATE, the pod as admitted,
then the patch, then validation of old vs new. A decision function that raises
(a 500, a denied request whatever the policy) fails the case."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pytest

from sandman.webhook.mutate import InjectionSettings
from sandman.webhook.policy import parse_policy_text
from sandman.webhook.review import (
    Context,
    Outcome,
    decide_mutation,
    decide_validation,
    parse_review,
)
from tests.admission_corpus import Case, check_pod, load
from tests.unit.webhook.jsonpatch import apply

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
DAEMON_IMAGE = "127.0.0.1:5000/sandman/daemon:corpus"


def context(case: Case) -> Context:
    ids = itertools.count(1)
    policy = parse_policy_text(case.policy)
    return Context(
        policy=lambda: policy,
        namespace_labels=lambda ns: case.namespace_labels,
        settings=InjectionSettings(daemon_image=DAEMON_IMAGE, version="corpus"),
        now=lambda: NOW,
        new_id=lambda: f"{next(ids):016x}",
        token_hash_for=lambda ns, sid: "a" * 64,
    )


def review(op: str, obj: dict[str, Any], old: Any = None, sub: str = "") -> Any:
    req = {
        "uid": "u",
        "kind": {"kind": "Pod"},
        "operation": op,
        "namespace": "corpus",
        "object": obj,
        "oldObject": old,
        "userInfo": {"username": "corpus-user"},
    }
    if sub:
        req["subResource"] = sub
    return parse_review(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}
    )


def admit_create(ctx: Context, pod: dict[str, Any]) -> tuple[Outcome, dict[str, Any]]:
    m = decide_mutation(ctx, review("CREATE", pod))
    if not m.allowed:
        return m, pod
    final = apply(pod, m.patch or [])
    v = decide_validation(ctx, review("CREATE", final))
    v.warnings = m.warnings + v.warnings
    return v, final


def judge(case: Case, out: Outcome) -> None:
    exp = case.expect
    if "denied" in exp:
        assert not out.allowed, f"{case.id}: allowed, expected a denial by {exp['denied']}"
        missing = set(exp["denied"]) - set(out.rule_ids)
        assert not missing, f"{case.id}: denied by {out.rule_ids}, not by {missing}"
        for rid in exp["denied"]:
            if rid != "contract":
                assert f"[{rid}]" in out.message, (case.id, out.message)
        assert "fix:" in out.message or "contract" in out.rule_ids, out.message
        return
    assert out.allowed, f"{case.id}: denied ({out.message}), expected allowed"
    for rid in exp.get("warned") or []:
        assert any(f"[{rid}]" in w for w in out.warnings), (case.id, out.warnings)


@pytest.mark.parametrize("case", load(), ids=lambda c: c.id)
def test_admission_case(case: Case) -> None:
    ctx = context(case)
    pod = case.pod
    if case.controller:
        # The controller's pods: its template plus an owner (what the apiserver sees).
        pod = {**pod, "metadata": {**pod["metadata"], "ownerReferences": [_owner(case)]}}
    if case.update is None:
        out, final = admit_create(ctx, pod)
        judge(case, out)
        if out.allowed:
            check_pod(case, final)
        return
    created, old = admit_create(ctx, pod)
    assert created.allowed, f"{case.id}: the pod to update was denied: {created.message}"
    old = {**old, "metadata": {**old["metadata"], "name": "p", "uid": "u-1"}}
    old["metadata"]["creationTimestamp"] = "2026-11-30T12:00:00Z"
    new = apply(old, case.update)
    out = decide_validation(ctx, review("UPDATE", new, old, case.subresource))
    judge(case, out)
    if out.allowed:
        check_pod(case, new)


def _owner(case: Case) -> dict[str, Any]:
    kind = "ReplicaSet" if case.controller == "Deployment" else case.controller
    return {"apiVersion": "apps/v1", "kind": kind, "name": "c", "uid": "u-c", "controller": True}
