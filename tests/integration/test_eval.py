"""The eval profile's "no reuse" and the run's pinned images, against the real apiserver.

- An eval sandbox cannot be claimed: the claim patch pools send is refused by
  the validating webhook (a rollout sandbox next to it is claimed fine), and
  its daemon refuses /v1/reset: a real daemon started with exactly the flags
  the webhook gave the pod answers 409 ``reset_disabled``.
- A tag that moves between the run's resolution and a task's start is
  refused: a real registry (Debian's docker-registry on loopback) serves the
  tag, the run pins it, the tag is pushed anew, and the task is an
  infrastructure failure that no sandbox was created for.
- An offline task whose sandbox starts where the network canary cannot run
  (kwok nodes run no process, so nothing enforces NetworkPolicy either) makes
  the run refuse; with --allow-unverified-network it records `unverified`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import shutil
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import CoreV1Api

from sandman.bench.task_images import build_task_images
from sandman.client import SandmanClient
from sandman.contract import ANN_PROFILE, LABEL_SANDBOX, LABEL_STATE, STATE_IDLE
from sandman.eval.canary import NetworkUnverified
from sandman.eval.network import offline_policies
from sandman.eval.results import ResultsDir
from sandman.eval.runner import EvalRun, Hooks, Options
from sandman.eval.spec import parse_spec
from sandman.harness.cluster.kwok_nodes import KWOK_TOLERATION, NODE_KIND_LABEL, on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.process import ManagedProcess, wait_until
from sandman.harness.kube import raw
from sandman.harness.testing import free_port, wait_for
from sandman.kube_async import JSON_PATCH, PODS, ApiError, KubeClient
from sandman.pools.claim import claim_patch
from sandman.registry import RegistryClient
from tests.unit.daemon.helpers import start_daemon, stop_daemon

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def _sandbox(name: str, profile: str | None) -> dict[str, Any]:
    ann = {ANN_PROFILE: profile} if profile else {}
    container = {
        "name": "main",
        "image": "127.0.0.1:5000/sandman/tiny:1",
        "command": ["sleep", "3600"],
        "resources": {"limits": {"cpu": "250m", "memory": "64Mi"}},
    }
    return {
        "metadata": {
            "name": name,
            "labels": {LABEL_SANDBOX: "true", LABEL_STATE: STATE_IDLE},
            "annotations": ann,
        },
        "spec": on_kwok({"containers": [container]}),
    }


async def test_an_eval_sandbox_cannot_be_claimed_or_reset(
    cluster: LocalCluster, core: CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    evalpod = raw(
        core.create_namespaced_pod(namespace, _sandbox("ev", "eval"), _preload_content=False)
    )
    rollout = raw(
        core.create_namespaced_pod(namespace, _sandbox("ro", None), _preload_content=False)
    )
    async with KubeClient.from_kubeconfig(cluster.kubeconfig) as kube:
        patch = claim_patch(evalpod, claimer="trainer", now=NOW, ttl=dt.timedelta(minutes=5))
        with pytest.raises(ApiError) as refused:
            await kube.patch(PODS, "ev", patch, namespace, content_type=JSON_PATCH)
        message = refused.value.body["message"]
        assert refused.value.status == 403 and "[no-reuse]" in message, message
        assert "profile 'eval'" in message and "fix:" in message
        patch = claim_patch(rollout, claimer="trainer", now=NOW, ttl=dt.timedelta(minutes=5))
        claimed = await kube.patch(PODS, "ro", patch, namespace, content_type=JSON_PATCH)
        assert claimed["metadata"]["labels"]["sandman.dev/claim"] == "held"

    # The daemon with the flags admission gave the pod (its address aside).
    command = evalpod["spec"]["containers"][0]["command"]
    flags = command[command.index("serve") + 1 : command.index("--")]
    assert "--no-reset" in flags
    d = start_daemon(tmp_path, *[f for f in flags if not f.startswith("--listen=")])
    try:
        status, body = d.request("POST", "/v1/reset")
        assert status == 409 and body["error"]["code"] == "reset_disabled", body
        assert "eval" in body["error"]["message"]
    finally:
        stop_daemon(d)


# -- a tag that moves ---------------------------------------------------------
@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    with loopback_registry(tmp_path) as host:
        yield host


@contextmanager
def loopback_registry(tmp_path: Path) -> Iterator[str]:
    """A plain-HTTP docker-registry on a free loopback port: its host:port."""
    if shutil.which("docker-registry") is None:
        pytest.skip("docker-registry missing (python -m sandman.harness.prereqs installs it)")
    host = f"127.0.0.1:{free_port()}"
    config = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(tmp_path / "data")}},
        "http": {"addr": host},
    }
    (tmp_path / "config.yml").write_text(yaml.safe_dump(config))
    proc = ManagedProcess(
        "eval-registry",
        ("docker-registry", "serve", str(tmp_path / "config.yml")),
        tmp_path / "run",
        tmp_path / "logs",
        stop_timeout_s=5,
    )
    proc.start()

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://{host}/v2/", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_until(proc, answers, timeout_s=30, what="serving /v2/")
        yield host
    finally:
        proc.stop()


async def test_a_tag_that_moves_after_resolution_is_refused(
    cluster: LocalCluster, core: CoreV1Api, namespace: str, registry: str, tmp_path: Path
) -> None:
    tag = f"eval-{uuid.uuid4().hex[:8]}"
    (ref,) = await asyncio.to_thread(build_task_images, registry, [tag], layer_mb=0.01)
    text = yaml.safe_dump({"tasks": [{"id": "moving", "image": ref, "test": {"command": "true"}}]})
    spec = parse_spec(text.encode(), name="moving", jsonl=False)
    seen: dict[str, Any] = {"phases": []}

    async def after_resolve(pins: Any) -> None:
        seen["pinned"] = pins[ref].digest
        # Someone pushes the tag again (new content) before the task starts.
        await asyncio.to_thread(build_task_images, registry, [tag], layer_mb=0.01)

    async def before_phase(attempt: Any, phase: str) -> None:
        seen["phases"].append(phase)

    out = ResultsDir(tmp_path / "run")
    async with (
        SandmanClient(kubeconfig=cluster.kubeconfig, namespace=namespace) as client,
        RegistryClient() as rc,
    ):
        result = await EvalRun(
            client, spec, out, Options(namespace=namespace), registry=rc,
            hooks=Hooks(after_resolve=after_resolve, before_phase=before_phase),
        ).run()  # fmt: skip
        now = await rc.resolve_digest(ref)
    (rec,) = result.records
    assert seen["pinned"] and now != seen["pinned"]
    assert rec["status"] == "infra_failed" and rec["reason"] == "TagMoved", rec
    assert rec["score"] is None and rec["attempts"] == 1  # refused, not retried
    assert seen["pinned"] in rec["message"] and now in rec["message"]
    assert seen["phases"] == []  # no sandbox was ever started for it
    assert core.list_namespaced_pod(namespace).items == []
    assert result.summary["line"] == "0 scored, 1 infra-failed after 1 attempts"
    assert not result.summary["complete"]
    run = out.load_run()
    assert run["pins"][ref]["digest"] == seen["pinned"]
    # The offline task got the namespace's offline policies, created by the run.
    assert sorted(run["network"]["created"]) == sorted(
        p["metadata"]["name"] for p in offline_policies()
    )


POLICY_LABEL = "sandman.dev/policy-test"
RULE = "test-eval-kwok"


@contextmanager
def kwok_eval_policy(
    cluster: LocalCluster,
    core: CoreV1Api,
    namespace: str,
    registry: str,
    eval_profile: dict[str, Any] | None = None,
) -> Iterator[None]:
    """A rule for the test's namespace whose eval profile places sandboxes on
    kwok nodes (``eval_profile``: that profile, which must select kwok nodes)."""
    handle = cluster.deployment.policy  # type: ignore[union-attr]
    original = handle.read()
    doc = yaml.safe_load(original)
    rules = doc.get("rules") or []
    rule = copy.deepcopy(next((r for r in rules if "namespaceSelector" not in r), rules[-1]))
    rule["name"] = RULE
    rule["namespaceSelector"] = {"matchLabels": {POLICY_LABEL: "eval-kwok"}}
    rule["allowedRegistries"] = [*rule.get("allowedRegistries", []), f"{registry}/*"]
    profile = rule.setdefault("profiles", {}).setdefault("eval", {})
    profile["nodeSelector"] = {NODE_KIND_LABEL: "kwok"}
    profile["tolerations"] = [KWOK_TOLERATION]
    if eval_profile is not None:
        rule["profiles"]["eval"] = eval_profile
    doc["rules"] = [rule, *[r for r in rules if r.get("name") != RULE]]
    handle.write(yaml.safe_dump(doc, sort_keys=False))
    core.patch_namespace(namespace, {"metadata": {"labels": {POLICY_LABEL: "eval-kwok"}}})
    probe = {
        "metadata": {"generateName": "probe-", "labels": {LABEL_SANDBOX: "true"},
                     "annotations": {ANN_PROFILE: "eval"}},
        "spec": {"containers": [{"name": "main", "image": "127.0.0.1:5000/sandman/tiny:1",
                                 "command": ["true"],
                                 "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}}}]},
    }  # fmt: skip

    def selected() -> bool:  # the webhook learns namespace labels by watch
        try:
            got = raw(core.create_namespaced_pod(namespace, probe, dry_run="All",
                                                 _preload_content=False))  # fmt: skip
        except Exception:
            return False
        return bool(got["spec"].get("nodeSelector", {}).get(NODE_KIND_LABEL) == "kwok")

    try:
        wait_for(selected, timeout=60, what="eval sandboxes admitted onto kwok nodes")
        yield
    finally:
        handle.write(original)


async def test_offline_tasks_where_the_canary_cannot_run_refuse_the_run(
    cluster: LocalCluster, core: CoreV1Api, namespace: str, registry: str, tmp_path: Path
) -> None:
    (ref,) = await asyncio.to_thread(build_task_images, registry, ["offline"], layer_mb=0.01)
    text = yaml.safe_dump({"tasks": [{"id": "offline", "image": ref, "test": {"command": "true"}}]})
    spec = parse_spec(text.encode(), name="offline", jsonl=False)
    opts = Options(namespace=namespace, attempts=1, start_timeout_s=120)
    with kwok_eval_policy(cluster, core, namespace, registry):
        # Through the apiserver: kwok pods have no daemon to ask, only Ready counts.
        async with (
            SandmanClient(kubeconfig=cluster.kubeconfig, namespace=namespace,
                          transport="proxy") as client,
            RegistryClient() as rc,
        ):  # fmt: skip
            refused = ResultsDir(tmp_path / "refused")
            with pytest.raises(NetworkUnverified) as e:
                await EvalRun(client, spec, refused, opts, registry=rc).run()
            # What was tried, what it means, how to fix it.
            assert "could not run in the offline sandbox" in str(e.value)
            assert "enforces NetworkPolicy" in str(e.value)
            assert "--allow-unverified-network" in str(e.value)
            net = refused.load_run()["network"]
            assert net["network"] == "unverified" and net["canary"] == "not_run", net
            (rec,) = refused.records().values()
            assert rec["status"] == "infra_failed" and rec["score"] is None, rec

            allowed = ResultsDir(tmp_path / "allowed")
            flagged = dataclasses.replace(opts, allow_unverified_network=True)
            result = await EvalRun(client, spec, allowed, flagged, registry=rc).run()
            net = allowed.load_run()["network"]
            assert net["network"] == "unverified" and net["canary"] == "not_run", net
            assert result.run["network"]["network"] == "unverified"
