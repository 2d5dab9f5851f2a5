"""Labeling pods that existing tooling makes (issue 16), on the real node.

Jobs end with their command's exit code; Deployments, StatefulSets, CronJobs
and generateName pods each get sandboxes; an image's own ENTRYPOINT/CMD runs
when the pod names no command (also through a multi-arch index); a registry
that cannot be reached is a denial that says so.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client import AppsV1Api, BatchV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman import tokens
from sandman.contract import ANN_INJECTED, LABEL_ID, LABEL_SANDBOX
from sandman.harness.cluster.kwok_nodes import NODE_KIND_LABEL
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.images.build import ImageBuilder
from sandman.harness.kube import api_client, raw
from sandman.harness.testing import free_port, namespace_rule, wait_for
from tests.e2e.test_sandbox import call, namespace_key

REAL = {NODE_KIND_LABEL: "real"}


def template(app: str, command: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"labels": {LABEL_SANDBOX: "true", "app": app}},
        "spec": {
            "nodeSelector": REAL,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": spec.pop("image"), "command": command}],
            **spec,
        },
    }


def ready_pod(core: CoreV1Api, ns: str, selector: str, timeout: float = 150) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        pods = raw(core.list_namespaced_pod(ns, label_selector=selector, _preload_content=False))
        for p in pods["items"]:
            conds = {c["type"]: c["status"] for c in p.get("status", {}).get("conditions", [])}
            if conds.get("Ready") == "True":
                return p
        return None

    return wait_for(find, timeout=timeout, what=f"a Ready pod {selector} in {ns}")


def exec_in(core: CoreV1Api, ns: str, pod: dict[str, Any], cmd: str) -> dict[str, Any]:
    token = tokens.sandbox_token(namespace_key(core, ns), pod["metadata"]["labels"][LABEL_ID])
    status, r = call(pod["status"]["podIP"], token, "/v1/exec", {"cmd": cmd})
    assert status == 200, r
    return r


def test_controllers_and_generate_name_pods_get_sandboxes(
    real_node: RealNode, cluster: LocalCluster, core: CoreV1Api, namespace: str, images: dict
) -> None:
    api = api_client(cluster.kubeconfig)
    apps, batch = AppsV1Api(api), BatchV1Api(api)
    sleep = ["sleep", "3600"]
    # The CronJob first: its controller fires at the next minute boundary, and
    # the other controllers' pods start while it waits.
    cron_pod = template("cron", sleep, image=images["tiny"], restartPolicy="Never")
    batch.create_namespaced_cron_job(
        namespace,
        {
            "metadata": {"name": "cron"},
            "spec": {
                "schedule": "* * * * *",
                "concurrencyPolicy": "Forbid",
                "jobTemplate": {"spec": {"backoffLimit": 0, "template": cron_pod}},
            },
        },
    )
    # Two containers: kubectl's default-container annotation picks the target.
    deploy = template("deploy", sleep, image=images["tiny"])
    deploy["metadata"]["annotations"] = {"kubectl.kubernetes.io/default-container": "main"}
    helper = {"name": "helper", "image": images["tiny"], "command": sleep}
    deploy["spec"]["containers"].insert(0, helper)
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "deploy"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "deploy"}},
                "template": deploy,
            },
        },
    )
    # Its own readiness probe is kept: Ready only once /tmp/ready exists AND the
    # daemon answers (the daemon runs the probe behind /readyz).
    sts = template("sts", sleep, image=images["swe"])
    sts["spec"]["containers"][0]["readinessProbe"] = {
        "exec": {"command": ["test", "-f", "/tmp/ready"]},
        "periodSeconds": 1,
    }
    apps.create_namespaced_stateful_set(
        namespace,
        {
            "metadata": {"name": "sts"},
            "spec": {
                "replicas": 1,
                "serviceName": "sts",
                "selector": {"matchLabels": {"app": "sts"}},
                "template": sts,
            },
        },
    )
    plain = template("plain", sleep, image=images["tiny"])
    plain["metadata"]["generateName"] = "plain-"
    core.create_namespaced_pod(namespace, plain)

    # the StatefulSet's pod: started, daemon answering, yet not Ready until its probe passes
    sts_pod = wait_for(
        lambda: _running(core, namespace, "sts-0"), timeout=150, what="sts-0 running"
    )
    wait_for(lambda: _answers(core, namespace, sts_pod), timeout=60, what="sts-0's daemon")
    assert _ready(core, namespace, "sts-0") is None
    exec_in(core, namespace, sts_pod, "touch /tmp/ready")

    owners = {"deploy": "ReplicaSet", "sts": "StatefulSet", "plain": None, "cron": "Job"}
    for app, owner in owners.items():
        pod = ready_pod(core, namespace, f"app={app}")
        target = next(c for c in pod["spec"]["containers"] if "--" in (c.get("command") or []))
        assert target["name"] == "main", (app, target["name"])
        md = pod["metadata"]
        assert ANN_INJECTED in md["annotations"], app
        kinds = [o["kind"] for o in md.get("ownerReferences", [])]
        assert kinds == ([owner] if owner else []), (app, kinds)
        if app == "plain":
            assert md["name"].startswith("plain-")
        r = exec_in(core, namespace, pod, "echo hello from $(hostname)")
        assert r["exit_code"] == 0 and r["stdout"] == f"hello from {md['name']}\n", (app, r)
    batch.patch_namespaced_cron_job("cron", namespace, {"spec": {"suspend": True}})


def _job(name: str, image: str, exit_code: int) -> dict[str, Any]:
    # Waits for a file that only a command through the daemon creates, so the
    # Job cannot finish unless the daemon answered while it ran. A native
    # sidecar rides along: left alone, and stopped by the kubelet at the end.
    script = f"until [ -f /tmp/go ]; do sleep 0.1; done; echo job {name} done; exit {exit_code}"
    pod = template(name, ["sh", "-c", script], image=image, restartPolicy="Never")
    sidecar = {
        "name": "side",
        "image": image,
        "restartPolicy": "Always",
        "command": ["sleep", "3600"],
    }
    pod["spec"]["initContainers"] = [sidecar]
    return {"metadata": {"name": name}, "spec": {"backoffLimit": 0, "template": pod}}


def _job_state(batch: BatchV1Api, ns: str, name: str) -> Callable[[], str | None]:
    def state() -> str | None:
        job = raw(batch.read_namespaced_job(name, ns, _preload_content=False))
        for c in job.get("status", {}).get("conditions", []):
            if c["type"] in ("Complete", "Failed") and c["status"] == "True":
                return str(c["type"])
        return None

    return state


def test_jobs_end_with_their_command_and_its_exit_code(
    real_node: RealNode, cluster: LocalCluster, core: CoreV1Api, namespace: str, images: dict
) -> None:
    batch = BatchV1Api(api_client(cluster.kubeconfig))
    for name, code in (("ok", 0), ("bad", 3)):
        batch.create_namespaced_job(namespace, _job(name, images["tiny"], code))
    pods = {name: ready_pod(core, namespace, f"app={name}") for name in ("ok", "bad")}
    for pod in pods.values():
        cmd = pod["spec"]["containers"][0]["command"]
        assert "--exit-with-command" in cmd[: cmd.index("--")], cmd
        inits = pod["spec"]["initContainers"]
        assert [c["name"] for c in inits] == ["sandman-install", "side"]
        assert inits[1]["command"] == ["sleep", "3600"]  # the sidecar is left as it was
    exec_in(core, namespace, pods["ok"], "touch /tmp/go")
    # In flight when the command exits: the daemon answers it before it exits.
    r = exec_in(core, namespace, pods["bad"], "touch /tmp/go; sleep 1; echo answered")
    assert r["stdout"] == "answered\n", r
    expected = {"ok": ("Complete", 0), "bad": ("Failed", 3)}
    for name, (condition, code) in expected.items():
        assert (
            wait_for(_job_state(batch, namespace, name), timeout=90, what=f"job {name}")
            == condition
        )
        pod = raw(
            core.read_namespaced_pod(
                pods[name]["metadata"]["name"], namespace, _preload_content=False
            )
        )
        term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["exitCode"] == code, term
        assert pod["status"]["phase"] == ("Succeeded" if code == 0 else "Failed")
        log = core.read_namespaced_pod_log(pod["metadata"]["name"], namespace, container="main")
        assert f"job {name} done" in log


def _push_index(
    real_node: RealNode, repo: str, tag: str, entries: list[tuple[Any, str]]
) -> tuple[str, str]:
    """An OCI index in the real registry: (manifest blob, architecture) entries."""
    manifests = [
        {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": m.digest,
            "size": m.size,
            "platform": {"os": "linux", "architecture": arch},
        }
        for m, arch in entries
    ]
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    }
    body = json.dumps(index).encode()
    resp = real_node.registry._request(
        "PUT",
        f"/v2/{repo}/manifests/{tag}",
        body=body,
        headers={"Content-Type": "application/vnd.oci.image.index.v1+json"},
    )
    assert resp.status == 201, resp.body
    return f"{real_node.registry.host}/{repo}:{tag}", "sha256:" + hashlib.sha256(body).hexdigest()


def test_an_image_entrypoint_and_cmd_run_without_a_command(
    real_node: RealNode, cluster: LocalCluster, core: CoreV1Api, namespace: str
) -> None:
    builder = ImageBuilder(cluster.config.cache_dir)
    entry = builder.build_and_push("entry", real_node.registry).ref
    entry_image, tiny_image = builder.build("entry"), builder.build("tiny")
    # A multi-arch index whose arm64 entry is another image (tiny, pushed into
    # the same repository): picking the wrong platform would run tiny's httpd
    # instead of the entrypoint script, and the log would show it.
    real_node.registry.push("sandman/entry", "arm64-stand-in", tiny_image, builder.store)
    multi, multi_digest = _push_index(
        real_node,
        "sandman/entry",
        "multi",
        [(tiny_image.manifest, "arm64"), (entry_image.manifest, "amd64")],
    )
    specs: dict[str, dict[str, Any]] = {
        "plain": {"image": entry},
        "args": {"image": entry, "args": ["sh", "-c", "echo from args; exec sleep 3600"]},
        "multi": {"image": multi},
    }
    for name, c in specs.items():
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": name, "labels": {LABEL_SANDBOX: "true"}},
                "spec": {
                    "nodeSelector": REAL,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", **c}],
                },
            },
        )
    # `$$` survives only because the webhook escaped the image's words
    # against the kubelet's $(VAR) expansion (which turns $$ into $).
    cmd_line = "entrypoint ran in /www with: sh -c echo cmd ran pid=$$; exec sleep 3600"
    pid = re.compile(r"^cmd ran pid=\d+$", re.M)
    expect: dict[str, list[str | re.Pattern[str]]] = {
        "plain": [cmd_line, pid],
        "args": ["entrypoint ran in /www with: sh -c echo from args; exec sleep 3600", "from args"],
        "multi": [cmd_line, pid],
    }
    for name, wanted in expect.items():
        pod = wait_for(
            lambda n=name: _ready(core, namespace, n), timeout=150, what=f"pod {name} Ready"
        )

        def logged(n: str = name, w: list[str | re.Pattern[str]] = wanted) -> bool:
            log = core.read_namespaced_pod_log(n, namespace, container="main")
            return all(x.search(log) if isinstance(x, re.Pattern) else x in log for x in w)

        wait_for(logged, timeout=30, what=f"pod {name}'s entrypoint output in its log")
        # the amd64 image's config in both cases, named by digest
        source = pod["metadata"]["annotations"]["sandman.dev/entrypoint-from"]
        assert source.endswith(
            "@" + (entry_image.manifest.digest if name != "multi" else multi_digest)
        )
        r = exec_in(core, namespace, pod, "pwd; id -u")
        assert r["stdout"] == "/www\n0\n", r  # the image's WORKDIR and USER


def _running(core: CoreV1Api, ns: str, name: str) -> dict[str, Any] | None:
    try:
        pod = raw(core.read_namespaced_pod(name, ns, _preload_content=False))
    except ApiException:
        return None
    statuses = pod.get("status", {}).get("containerStatuses") or []
    running = statuses and all("running" in (s.get("state") or {}) for s in statuses)
    return pod if running and pod["status"].get("podIP") else None


def _answers(core: CoreV1Api, ns: str, pod: dict[str, Any]) -> bool:
    token = tokens.sandbox_token(namespace_key(core, ns), pod["metadata"]["labels"][LABEL_ID])
    try:
        status, _ = call(pod["status"]["podIP"], token, "/v1/exec", {"cmd": "true"})
    except OSError:
        return False
    return status == 200


def _ready(core: CoreV1Api, ns: str, name: str) -> dict[str, Any] | None:
    pod = raw(core.read_namespaced_pod(name, ns, _preload_content=False))
    conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
    return pod if conds.get("Ready") == "True" else None


def test_an_unreachable_registry_is_a_denial_that_says_so(
    real_node: RealNode, cluster: LocalCluster, core: CoreV1Api, namespace: str
) -> None:
    registry = f"127.0.0.1:{free_port()}"  # nobody listens there
    image = f"{registry}/sandman/tiny:1"
    pod = {
        "metadata": {"name": "lost", "labels": {LABEL_SANDBOX: "true"}},
        "spec": {"nodeSelector": REAL, "containers": [{"name": "main", "image": image}]},
    }

    def denial() -> str:
        with pytest.raises(ApiException) as e:
            core.create_namespaced_pod(namespace, pod, dry_run="All")
        assert e.value.status == 403
        return str(json.loads(e.value.body)["message"])

    # Under the local policy the registry rule refuses the image before any
    # lookup: admission never connects to a host the policy refuses.
    message = denial()
    assert "[registry]" in message and "[image-config]" not in message, message

    # A rule for this namespace that allows that registry: now the image's
    # ENTRYPOINT must be read, and the registry cannot be reached.
    def past_the_registry_rule() -> str | None:
        m = denial()
        return None if "[registry]" in m else m

    with namespace_rule(cluster, core, namespace, allowedRegistries=[f"{registry}/*"]):
        message = wait_for(
            past_the_registry_rule, timeout=30, what="the namespace's own rule in force"
        )
        assert "[image-config]" in message and image in message, message
        # the webhook's own loopback is no registry endpoint: never connected to
        assert "could not be read from its registry" in message
        assert f"image config lookup failed for {registry}: refused address" in message
        assert "fix: set `command`" in message
        # with a command there is nothing to look up: the pod is admitted
        pod["spec"]["containers"][0]["command"] = ["sleep", "1"]
        core.create_namespaced_pod(namespace, pod, dry_run="All")
