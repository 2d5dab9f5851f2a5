"""The admission corpus through the real apiserver and webhook (cases marked `apiserver`).

Where the apiserver matters: which requests reach the webhook at all (the
webhook configurations' rules and selectors: UPDATEs, subresources such as
pods/ephemeralcontainers and pods/resize, a label added by UPDATE), what it
normalises before we see it, and the controllers that turn templates into
pods. CREATEs are server-side dry runs (nothing stored); an UPDATE creates the
pod for real (on a kwok node), then sends the patch as a dry run.

A file with its own policy gets it as a rule set selected by the label
`sandman.dev/corpus=<file>` on that file's namespace, prepended to the cluster's
policy for the module and restored afterwards.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.client import AppsV1Api, BatchV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.contract import ANN_INJECTED, ANN_PROFILE, LABEL_SANDBOX
from sandman.harness.cluster.kwok_nodes import on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import api_client, raw
from sandman.harness.testing import wait_for
from tests.admission_corpus import Case, check_pod, load, rules_in

CASES = [c for c in load() if c.apiserver]
FILES = sorted({c.file for c in CASES})
CORPUS_LABEL = "sandman.dev/corpus"
JSON_PATCH = "application/json-patch+json"


def _rule_name(file: str) -> str:
    return f"corpus-{file}".replace("_", "-")[:63]


@pytest.fixture(scope="module")
def corpus_namespaces(cluster: LocalCluster, core: CoreV1Api) -> Iterator[dict[str, str]]:
    """One namespace per corpus file, governed by that file's policy."""
    deployment = cluster.deployment
    assert deployment is not None
    path = deployment.policy_file
    original = path.read_text()
    doc = yaml.safe_load(original)
    own = {c.file: c.policy for c in CASES if "policy" in _file_doc(c.file)}
    extra = []
    for file, text in own.items():
        for r in yaml.safe_load(text)["rules"]:
            extra.append(
                {
                    **r,
                    "name": _rule_name(file),
                    "namespaceSelector": {"matchLabels": {CORPUS_LABEL: file}},
                }
            )
    doc["rules"] = extra + doc["rules"]
    path.write_text(yaml.safe_dump(doc))
    names = {}
    try:
        for file in FILES:
            ns = f"corpus-{file.replace('_', '-')}-{uuid.uuid4().hex[:5]}"
            core.create_namespace({"metadata": {"name": ns, "labels": {CORPUS_LABEL: file}}})
            names[file] = ns
        for file, ns in names.items():
            want = _rule_name(file) if file in own else "local-default"
            wait_for(
                lambda ns=ns, want=want: _governs(core, ns) == want,
                timeout=30,
                what=f"policy {want} governing {ns}",
            )
        yield names
    finally:
        path.write_text(original)
        for ns in names.values():
            try:
                core.delete_namespace(ns)
            except ApiException as e:
                if e.status != 404:
                    raise


def _file_doc(file: str) -> dict[str, Any]:
    from tests.admission_corpus import CORPUS

    return yaml.safe_load((CORPUS / f"{file}.yaml").read_text())


def _governs(core: CoreV1Api, ns: str) -> str | None:
    """The name of the rule set that decides in ``ns`` (from a denial's text)."""
    probe = {
        "metadata": {
            "generateName": "probe-",
            "labels": {LABEL_SANDBOX: "true"},
            "annotations": {ANN_PROFILE: "no-such-profile"},
        },
        "spec": {"containers": [{"name": "c", "image": "127.0.0.1:5000/sandman/tiny:1"}]},
    }
    try:
        # A rule set in warn (or audit) mode admits it: its name is in the warning.
        resp = core.create_namespaced_pod(ns, probe, dry_run="All", _preload_content=False)
        msg = ", ".join(resp.headers.getlist("Warning"))
    except ApiException as e:
        msg = str(e.body)
    if "sandman policy '" in msg:
        return msg.split("sandman policy '", 1)[1].split("'", 1)[0]
    return None


def _message(e: ApiException) -> str:
    try:
        return str(yaml.safe_load(e.body).get("message", e.body))
    except Exception:
        return str(e.body)


def _judge_denied(case: Case, e: ApiException) -> None:
    msg = _message(e)
    assert e.status in (400, 403, 422), (case.id, e.status, msg)
    missing = set(case.expect["denied"]) - rules_in(msg)
    assert not missing, f"{case.id}: denied without {missing}: {msg}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_admission_case_through_the_apiserver(
    cluster: LocalCluster, core: CoreV1Api, corpus_namespaces: dict[str, str], case: Case
) -> None:
    ns = corpus_namespaces[case.file]
    if case.controller:
        _controller_case(cluster, core, ns, case)
        return
    pod = {**case.pod, "spec": on_kwok(case.pod["spec"])}
    if "raw_pod" in case.raw:
        _raw_case(cluster, ns, case)
        return
    if case.update is None:
        try:
            got = raw(core.create_namespaced_pod(ns, pod, dry_run="All", _preload_content=False))
        except ApiException as e:
            assert "denied" in case.expect, f"{case.id}: denied: {_message(e)}"
            _judge_denied(case, e)
            return
        assert "allowed" in case.expect, f"{case.id}: admitted, expected {case.expect}"
        check_pod(case, got)
        return
    created = raw(core.create_namespaced_pod(ns, pod, _preload_content=False))
    name = created["metadata"]["name"]
    patch = {
        "": core.patch_namespaced_pod,
        "ephemeralcontainers": core.patch_namespaced_pod_ephemeralcontainers,
        "resize": core.patch_namespaced_pod_resize,
    }[case.subresource]
    try:
        got = raw(
            patch(
                name,
                ns,
                case.update,
                dry_run="All",
                _content_type=JSON_PATCH,
                _preload_content=False,
            )
        )
    except ApiException as e:
        assert "denied" in case.expect, f"{case.id}: denied: {_message(e)}"
        _judge_denied(case, e)
        return
    assert "allowed" in case.expect, f"{case.id}: admitted, expected {case.expect}"
    check_pod(case, got)


def _raw_case(cluster: LocalCluster, ns: str, case: Case) -> None:
    """The request body verbatim (duplicated keys and all), as kubectl sends a file."""
    proc = subprocess.run(
        [
            str(cluster.binaries.kubectl),
            f"--kubeconfig={cluster.kubeconfig}",
            "create",
            "--dry-run=server",
            "-n",
            ns,
            "-o",
            "json",
            "-f",
            "-",
        ],
        input=case.raw["raw_pod"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "denied" in case.expect:
        assert proc.returncode != 0, f"{case.id}: admitted"
        missing = set(case.expect["denied"]) - rules_in(proc.stderr)
        assert not missing, f"{case.id}: denied without {missing}: {proc.stderr}"
        return
    assert proc.returncode == 0, f"{case.id}: {proc.stderr}"
    check_pod(case, json.loads(proc.stdout))


def _controller_case(cluster: LocalCluster, core: CoreV1Api, ns: str, case: Case) -> None:
    """A controller's template: its pods are denied (PolicyDenied on the owner) or injected."""
    client = api_client(cluster.kubeconfig)
    md = {k: v for k, v in case.pod["metadata"].items() if k != "generateName"}
    app = {"corpus-case": uuid.uuid4().hex[:8]}
    template = {
        "metadata": {**md, "labels": {**md.get("labels", {}), **app}},
        "spec": on_kwok(case.pod["spec"]),
    }
    name = f"c-{app['corpus-case']}"
    if case.controller == "Deployment":
        AppsV1Api(client).create_namespaced_deployment(
            ns,
            {
                "metadata": {"name": name},
                "spec": {"replicas": 1, "selector": {"matchLabels": app}, "template": template},
            },
        )
        owner_kind = "ReplicaSet"
    elif case.controller == "Job":
        template["spec"] = {**template["spec"], "restartPolicy": "Never"}
        BatchV1Api(client).create_namespaced_job(
            ns, {"metadata": {"name": name}, "spec": {"backoffLimit": 0, "template": template}}
        )
        owner_kind = "Job"
    else:
        pytest.fail(f"{case.id}: controller {case.controller} not run through the apiserver")
    selector = ",".join(f"{k}={v}" for k, v in app.items())

    def outcome() -> tuple[str, Any] | None:
        pods = raw(core.list_namespaced_pod(ns, label_selector=selector, _preload_content=False))
        if pods["items"]:
            return "pod", pods["items"][0]
        for ev in raw(core.list_namespaced_event(ns, _preload_content=False))["items"]:
            obj = ev["involvedObject"]
            ours = obj["kind"] == owner_kind and obj["name"].startswith(name)
            if ev["reason"] == "PolicyDenied" and ours:
                return "denied", ev["message"]
        return None

    kind, value = wait_for(outcome, timeout=60, what=f"{case.controller} {name}: a pod or a denial")
    if "denied" in case.expect:
        assert kind == "denied", f"{case.id}: a pod was created: {value['metadata']['name']}"
        missing = set(case.expect["denied"]) - rules_in(value)
        assert not missing, f"{case.id}: denied without {missing}: {value}"
        return
    assert kind == "pod", f"{case.id}: denied: {value}"
    assert ANN_INJECTED in value["metadata"]["annotations"]
    check_pod(case, value)
