"""The webhook through the real apiserver: injection shapes, policy, failure modes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import AppsV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.contract import (
    ANN_CONTAINER,
    ANN_EXPIRES_AT,
    ANN_INJECTED,
    DAEMON_ARGV,
    LABEL_ID,
    LABEL_SANDBOX,
    NAMESPACE,
    REASON_POLICY_LOADED,
    REASON_POLICY_REJECTED,
)
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.overlay import POLICY_CONFIGMAP
from sandman.harness.kube import api_client, raw
from sandman.harness.testing import kubectl, wait_for

SANDBOX = {LABEL_SANDBOX: "true"}


def sandbox_pod(
    name: str = "",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    md: dict[str, Any] = {"labels": {**SANDBOX, **(labels or {})}}
    if name:
        md["name"] = name
    else:
        md["generateName"] = "sb-"
    if annotations is not None:
        md["annotations"] = annotations
    spec.setdefault("containers", [{"name": "main", "image": KWOK_IMAGE}])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": on_kwok(spec)}


def template(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod as a controller's template: no kind, no name."""
    out = {k: v for k, v in pod.items() if k not in ("apiVersion", "kind")}
    out["metadata"] = {k: v for k, v in pod["metadata"].items() if k != "generateName"}
    return out


def create(core: CoreV1Api, ns: str, pod: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return raw(core.create_namespaced_pod(ns, pod, _preload_content=False, **kw))


def assert_injected(pod: dict[str, Any], target: str = "main") -> dict[str, Any]:
    md, spec = pod["metadata"], pod["spec"]
    assert ANN_INJECTED in md["annotations"] and ANN_EXPIRES_AT in md["annotations"]
    assert len(md["labels"][LABEL_ID]) == 16
    assert spec["schedulerName"] == "sandman-scheduler"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["activeDeadlineSeconds"] > 0
    assert [c["name"] for c in spec["initContainers"]].count("sandman-install") == 1
    c = next(c for c in spec["containers"] if c["name"] == target)
    # daemon flags (exit-with-command, readiness probe) may come before "--"
    head = [*DAEMON_ARGV, "serve", "--listen=0.0.0.0:7878"]
    assert c["command"][: len(head)] == head
    assert "--" in c["command"]
    assert "SANDMAN_TOKEN_SHA256" in {e["name"] for e in c["env"]}
    assert not any(v["name"].startswith("kube-api-access-") for v in spec.get("volumes", []))
    return c


def test_injection_shapes(core: CoreV1Api, namespace: str, cluster: LocalCluster) -> None:
    # generateName, no annotations map, no command: the image's CMD runs (tiny's
    # httpd) where the cluster has a registry; without one the webhook reads no
    # image configs (--image-config-lookup=off) and the daemon runs alone.
    c = assert_injected(create(core, namespace, sandbox_pod()))
    tiny_cmd = ["httpd", "-f", "-v", "-p", "8080", "-h", "/www"]
    assert original_command(c) == (tiny_cmd if cluster.real_node else [])
    # existing init containers and a native sidecar; several containers, target by annotation;
    # existing command/args/probes/securityContext
    pod = sandbox_pod(
        "shapes",
        annotations={ANN_CONTAINER: "agent"},
        initContainers=[
            {"name": "setup", "image": KWOK_IMAGE, "command": ["true"]},
            {"name": "proxy", "image": KWOK_IMAGE, "restartPolicy": "Always"},
        ],
        containers=[
            {"name": "helper", "image": KWOK_IMAGE},
            {
                "name": "agent",
                "image": KWOK_IMAGE,
                "command": ["python3"],
                "args": ["-m", "x"],
                "livenessProbe": {"exec": {"command": ["true"]}},
                "readinessProbe": {"exec": {"command": ["true"]}},
                "securityContext": {"runAsUser": 1000, "allowPrivilegeEscalation": False},
            },
        ],
    )
    got = create(core, namespace, pod)
    agent = assert_injected(got, "agent")
    assert original_command(agent) == ["python3", "-m", "x"] and "args" not in agent
    assert agent["livenessProbe"] == {"exec": {"command": ["true"]}, **_probe_defaults()}
    # the agent's own readiness probe is combined with the daemon's (GET /readyz)
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert agent["securityContext"]["runAsUser"] == 1000
    inits = [i["name"] for i in got["spec"]["initContainers"]]
    assert inits == ["sandman-install", "setup", "proxy"]
    helper = got["spec"]["containers"][0]
    assert "command" not in helper


def original_command(c: dict[str, Any]) -> list[str]:
    return c["command"][c["command"].index("--") + 1 :]


def _probe_defaults() -> dict[str, int]:
    return {"timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}


def test_unlabeled_pods_are_untouched(core: CoreV1Api, namespace: str) -> None:
    pod = {
        "metadata": {"name": "plain"},
        "spec": on_kwok({"containers": [{"name": "c", "image": KWOK_IMAGE}]}),
    }
    got = create(core, namespace, pod)
    assert ANN_INJECTED not in (got["metadata"].get("annotations") or {})
    assert "initContainers" not in got["spec"]
    assert got["spec"]["schedulerName"] == "default-scheduler"


def test_reapply_does_not_double_inject(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(sandbox_pod("applied")))
    kubectl(cluster, "apply", "-n", namespace, "-f", str(manifest))
    first = json.loads(kubectl(cluster, "get", "pod", "applied", "-n", namespace, "-o", "json"))
    kubectl(cluster, "apply", "-n", namespace, "-f", str(manifest))
    again = json.loads(kubectl(cluster, "get", "pod", "applied", "-n", namespace, "-o", "json"))
    assert_injected(again)
    assert again["spec"] == first["spec"]
    assert again["metadata"]["labels"][LABEL_ID] == first["metadata"]["labels"][LABEL_ID]


def test_controller_pods_are_injected(
    cluster: LocalCluster, core: CoreV1Api, namespace: str
) -> None:
    apps = AppsV1Api(api_client(cluster.kubeconfig))
    tmpl = template(sandbox_pod(labels={"app": "fleet"}))
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "fleet"},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "fleet"}},
                "template": tmpl,
            },
        },
    )

    def pods() -> list[dict[str, Any]]:
        items = raw(
            core.list_namespaced_pod(namespace, label_selector="app=fleet", _preload_content=False)
        )["items"]
        return items if len(items) == 3 else []

    items = wait_for(pods, what="3 deployment pods")
    for p in items:
        assert_injected(p)
    # Each replica gets its own id, though the template is shared.
    assert len({p["metadata"]["labels"][LABEL_ID] for p in items}) == 3


def test_dry_run_gets_the_same_answer_and_creates_nothing(core: CoreV1Api, namespace: str) -> None:
    got = create(core, namespace, sandbox_pod("dry"), dry_run="All")
    assert_injected(got)
    with pytest.raises(ApiException) as e:
        core.read_namespaced_pod("dry", namespace)
    assert e.value.status == 404
    events = raw(core.list_namespaced_event(namespace, _preload_content=False))["items"]
    assert not [ev for ev in events if ev["reason"].startswith(("Policy", "Sandbox"))]


# -- policy ------------------------------------------------------------------------
TEST_RULES = """\
- name: test-enforce
  namespaceSelector: {matchLabels: {sandman.dev/policy-test: enforce}}
  mode: enforce
  allowedRegistries: ["127.0.0.1:5000/*"]
  resources: {max: {cpu: "1", memory: 1Gi, ephemeral-storage: 1Gi}}
  ttl: {default: 1h, max: 2h}
  idleTimeout: {max: 30m}
  runtimeClassName: null
- name: test-warn
  namespaceSelector: {matchLabels: {sandman.dev/policy-test: warn}}
  mode: warn
  allowedRegistries: ["127.0.0.1:5000/*"]
  resources: {max: {cpu: "1", memory: 1Gi, ephemeral-storage: 1Gi}}
  ttl: {default: 1h, max: 2h}
  idleTimeout: {max: 30m}
"""


@pytest.fixture(scope="module")
def policy_modes(cluster: LocalCluster) -> Iterator[None]:
    """Prepends the test rule sets to the cluster's policy file, then restores it."""
    deployment = cluster.deployment
    assert deployment is not None
    path = deployment.policy_file
    original = path.read_text()
    doc = yaml.safe_load(original)
    doc["rules"] = yaml.safe_load(TEST_RULES) + doc["rules"]
    path.write_text(yaml.safe_dump(doc))
    yield
    path.write_text(original)


@pytest.fixture
def policy_ns(core: CoreV1Api, request: pytest.FixtureRequest, namespace: str) -> str:
    mode = request.param
    core.patch_namespace(namespace, {"metadata": {"labels": {"sandman.dev/policy-test": mode}}})
    return namespace


VIOLATIONS = {
    "registry": lambda p: p["spec"]["containers"][0].update(image="docker.io/library/evil:1"),
    "privileged": lambda p: p["spec"]["containers"][0].update(securityContext={"privileged": True}),
    "capabilities": lambda p: p["spec"]["containers"][0].update(
        securityContext={"capabilities": {"add": ["SYS_ADMIN"]}}
    ),
    "host-namespaces": lambda p: p["spec"].update(hostNetwork=True),
    "host-ports": lambda p: p["spec"]["containers"][0].update(
        ports=[{"containerPort": 80, "hostPort": 8080}]
    ),
    "host-paths": lambda p: p["spec"].update(volumes=[{"name": "h", "hostPath": {"path": "/etc"}}]),
    "service-account-token": lambda p: p["spec"].update(
        volumes=[{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]
    ),
    "resources-max": lambda p: p["spec"]["containers"][0].update(
        resources={"limits": {"memory": "2Gi"}}
    ),
    "ttl-max": lambda p: p["metadata"].update(annotations={"sandman.dev/ttl": "3h"}),
    "idle-timeout-max": lambda p: p["metadata"].update(
        annotations={"sandman.dev/idle-timeout": "1h"}
    ),
    "profile": lambda p: p["metadata"].update(annotations={"sandman.dev/profile": "gpu"}),
}


def _create_until_policy_applies(
    core: CoreV1Api, ns: str, pod: dict[str, Any], expect_denied: bool
) -> Any:
    """Create until the test rule sets (not the cluster's default) decide.

    The policy file is re-read every 2 s and namespace labels arrive by watch,
    so the first attempts may still meet the cluster's default rules.
    """
    deadline = time.monotonic() + 15
    while True:
        try:
            got = core.create_namespaced_pod(ns, pod, _preload_content=False)
        except ApiException as e:
            if e.status != 403:
                raise
            if expect_denied and "'test-enforce'" in json.loads(e.body)["message"]:
                return e
            last = json.loads(e.body)["message"]
        else:
            warnings = got.headers.get("Warning", "")
            if not expect_denied and "'test-warn'" in warnings:
                return got
            core.delete_namespaced_pod(
                json.loads(got.data)["metadata"]["name"], ns, grace_period_seconds=0
            )
            last = f"admitted with warnings {warnings!r}"
        if time.monotonic() > deadline:
            raise AssertionError(f"the test rules never decided; last: {last}")
        time.sleep(0.5)


@pytest.mark.usefixtures("policy_modes")
@pytest.mark.parametrize("policy_ns", ["enforce"], indirect=True)
@pytest.mark.parametrize("rule", sorted(VIOLATIONS))
def test_enforce_denies_each_rule_with_its_fix(core: CoreV1Api, policy_ns: str, rule: str) -> None:
    pod = sandbox_pod()
    VIOLATIONS[rule](pod)
    err = _create_until_policy_applies(core, policy_ns, pod, expect_denied=True)
    msg = json.loads(err.body)["message"]
    assert f"[{rule}]" in msg and "fix:" in msg and "test-enforce" in msg, msg


@pytest.mark.usefixtures("policy_modes")
@pytest.mark.parametrize("policy_ns", ["warn"], indirect=True)
# privileged and ttl-max are refused in every mode (corpus integrity_warn.yaml).
@pytest.mark.parametrize("rule", ["registry", "capabilities", "resources-max", "idle-timeout-max"])
def test_warn_admits_with_a_warning(core: CoreV1Api, policy_ns: str, rule: str) -> None:
    pod = sandbox_pod()
    VIOLATIONS[rule](pod)
    got = _create_until_policy_applies(core, policy_ns, pod, expect_denied=False)
    assert f"[{rule}]" in got.headers["Warning"]


def test_policy_denial_event_on_the_owner(
    cluster: LocalCluster, core: CoreV1Api, namespace: str
) -> None:
    apps = AppsV1Api(api_client(cluster.kubeconfig))
    tmpl = template(sandbox_pod(labels={"app": "bad"}))
    tmpl["spec"]["containers"][0]["image"] = "docker.io/library/evil:1"  # local policy: denied
    apps.create_namespaced_replica_set(
        namespace,
        {
            "metadata": {"name": "bad"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "bad"}}, "template": tmpl},
        },
    )

    def denied_event() -> list[dict[str, Any]]:
        items = raw(core.list_namespaced_event(namespace, _preload_content=False))["items"]
        return [
            e
            for e in items
            if e["reason"] == "PolicyDenied" and e["involvedObject"]["kind"] == "ReplicaSet"
        ]

    events = wait_for(denied_event, what="a PolicyDenied event on the ReplicaSet")
    assert "[registry]" in events[0]["message"]


def _policy_events(core: CoreV1Api, reason: str, seen: set[str]) -> list[dict[str, Any]]:
    """Events of ``reason`` on the policy ConfigMap, other than those named in ``seen``."""
    items = raw(core.list_namespaced_event(NAMESPACE, _preload_content=False))["items"]
    return [
        e
        for e in items
        if e["reason"] == reason
        and e["involvedObject"]["kind"] == "ConfigMap"
        and e["involvedObject"]["name"] == POLICY_CONFIGMAP
        and e["metadata"]["name"] not in seen
    ]


def test_a_broken_policy_is_refused_on_the_configmap_and_the_last_good_one_stays(
    cluster: LocalCluster, core: CoreV1Api, namespace: str
) -> None:
    assert cluster.deployment is not None
    handle = cluster.deployment.policy
    original = handle.read()
    broken = original.replace("mode: enforce", "mode: sometimes", 1)
    assert broken != original
    before = {
        e["metadata"]["name"]
        for reason in (REASON_POLICY_REJECTED, REASON_POLICY_LOADED)
        for e in _policy_events(core, reason, set())
    }
    # `kubectl apply` of it succeeds; the webhooks refuse it.
    with pytest.raises(ValueError, match="rejected the policy"):
        handle.write(broken)
    try:
        events = wait_for(
            lambda: _policy_events(core, REASON_POLICY_REJECTED, before),
            timeout=30,
            what="a PolicyRejected Event on the policy ConfigMap",
        )
        assert events[0]["type"] == "Warning"
        assert "sometimes" in events[0]["message"], events[0]["message"]
        assert "previous one stays in force" in events[0]["message"]
        # The last good policy still decides: local registry only.
        pod = sandbox_pod()
        pod["spec"]["containers"][0]["image"] = "docker.io/library/evil:1"
        with pytest.raises(ApiException) as denied:
            create(core, namespace, pod, dry_run="All")
        assert "[registry]" in json.loads(denied.value.body)["message"]
        assert_injected(create(core, namespace, sandbox_pod(), dry_run="All"))
    finally:
        handle.write(original)  # waits until every webhook has it in force again
    loaded = wait_for(
        lambda: _policy_events(core, REASON_POLICY_LOADED, before),
        timeout=30,
        what="a PolicyLoaded Event once the policy is fixed",
    )
    assert loaded[0]["type"] == "Normal" and "in force" in loaded[0]["message"]


# -- failure modes -------------------------------------------------------------------
def test_webhook_down_fails_sandboxes_only(
    cluster: LocalCluster, core: CoreV1Api, namespace: str
) -> None:
    deployment = cluster.deployment
    assert deployment is not None
    deployment.stop_webhook()  # in-cluster: scaled to 0; host mode: the process stopped
    try:
        with pytest.raises(ApiException) as e:
            create(core, namespace, sandbox_pod())
        body = json.loads(e.value.body)
        assert e.value.status == 500
        assert "inject.sandman.dev" in body["message"]  # names the webhook that failed
        plain = {
            "metadata": {"generateName": "plain-"},
            "spec": on_kwok({"containers": [{"name": "c", "image": KWOK_IMAGE}]}),
        }
        create(core, namespace, plain)  # unaffected
    finally:
        deployment.start_webhook()
    assert_injected(create(core, namespace, sandbox_pod()))
