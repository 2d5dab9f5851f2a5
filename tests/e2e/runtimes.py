"""Running e2e tests under a RuntimeClass: runc (the node's default) or gVisor.

gVisor is asked for the way an admin would: a policy rule requiring
``runtimeClassName: gvisor`` for a namespace (the webhook sets it on every
sandbox there). ``gvisor_policy`` prepends such a rule, a copy of the
cluster's default rule, selecting namespaces labelled
``sandman.dev/policy-test=gvisor``; ``use_runtime`` labels a test's namespace
and waits until the webhook answers with the runtime class.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import yaml
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.contract import LABEL_NODE_KIND, LABEL_SANDBOX
from sandman.harness.cluster import gvisor
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import raw
from sandman.harness.testing import wait_for

RUNTIMES = ("runc", "gvisor")
POLICY_LABEL = "sandman.dev/policy-test"
GVISOR_RULE = "test-gvisor"
# Shell that prints evidence of the kernel a sandbox runs on: gVisor's
# /proc/version names a made-up 4.4.0 kernel and its dmesg starts with
# "Starting gVisor..."; under runc the host's kernel answers (dmesg is refused).
RUNTIME_PROBE = "cat /proc/version; dmesg 2>&1 | head -n 5"


def assert_runs_under(runtime: str, probe_output: str) -> None:
    """``probe_output``: what RUNTIME_PROBE printed inside the sandbox."""
    if runtime == "gvisor":
        assert "gVisor" in probe_output, probe_output
        assert os.uname().release not in probe_output, probe_output
    else:
        assert os.uname().release in probe_output, probe_output
        assert "gVisor" not in probe_output, probe_output


def gvisor_rule(policy: dict[str, Any]) -> dict[str, Any]:
    """The cluster's default rule (the one without a namespace selector), as
    a rule that also requires the gvisor RuntimeClass in labelled namespaces."""
    rules = policy.get("rules") or []
    base = next((r for r in rules if "namespaceSelector" not in r), rules[-1] if rules else {})
    rule = copy.deepcopy(base)
    rule.update(
        name=GVISOR_RULE,
        namespaceSelector={"matchLabels": {POLICY_LABEL: "gvisor"}},
        runtimeClassName=gvisor.RUNTIME_CLASS,
    )
    return rule


@contextmanager
def gvisor_policy(cluster: LocalCluster) -> Iterator[Any]:
    """Prepend the gvisor rule to the cluster's policy; restore it after.

    Yields the deployment's policy handle (a file for host processes, the
    ConfigMap in-cluster: both have read_text/write_text, and in-cluster the
    write waits until every webhook has loaded it)."""
    deployment = cluster.deployment
    assert deployment is not None, "the test cluster runs Sandman's webhook"
    path = deployment.policy_file
    original = path.read_text()
    doc = yaml.safe_load(original)
    if not any(r.get("name") == GVISOR_RULE for r in doc.get("rules") or []):
        doc["rules"] = [gvisor_rule(doc), *(doc.get("rules") or [])]
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        yield path
    finally:
        path.write_text(original)


def _dry_run_runtime(core: CoreV1Api, namespace: str, image: str) -> str | None:
    pod = {
        "metadata": {"generateName": "probe-", "labels": {LABEL_SANDBOX: "true"}},
        "spec": {
            "nodeSelector": {LABEL_NODE_KIND: "real"},
            "containers": [{"name": "main", "image": image}],
        },
    }
    try:
        got = raw(core.create_namespaced_pod(namespace, pod, dry_run="All", _preload_content=False))
    except ApiException:
        return None  # e.g. the namespace's ServiceAccount is not there yet
    return got["spec"].get("runtimeClassName")


def use_runtime(core: CoreV1Api, namespace: str, runtime: str, image: str) -> None:
    """Make sandboxes created in ``namespace`` run under ``runtime``.

    The webhook re-reads the policy file every 2 s and learns namespace labels
    by watch, so this waits until a dry-run sandbox gets the class.
    """
    want = gvisor.RUNTIME_CLASS if runtime == "gvisor" else None
    if want:
        core.patch_namespace(namespace, {"metadata": {"labels": {POLICY_LABEL: runtime}}})
    t0 = time.monotonic()
    wait_for(
        lambda: _dry_run_runtime(core, namespace, image) == want or None,
        timeout=60,
        what=f"sandboxes in {namespace} admitted with runtimeClassName {want}",
    )
    if want:
        print(f"policy requires {want} in {namespace} after {time.monotonic() - t0:.1f}s")
