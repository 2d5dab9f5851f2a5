"""The eval profile's "no reuse" and the run's pinned images, against the real apiserver.

- An eval sandbox cannot be claimed: the claim patch pools send is refused by
  the validating webhook (a rollout sandbox next to it is claimed fine), and
  its daemon refuses /v1/reset: a real daemon started with exactly the flags
  the webhook gave the pod answers 409 ``reset_disabled``.
- A tag that moves between the run's resolution and a task's start is
  refused: a real registry (Debian's docker-registry on loopback) serves the
  tag, the run pins it, the tag is pushed anew, and the task is an
  infrastructure failure that no sandbox was created for.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import shutil
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import CoreV1Api

from sandman.bench.task_images import build_task_images
from sandman.client import SandmanClient
from sandman.contract import ANN_PROFILE, LABEL_SANDBOX, LABEL_STATE, STATE_IDLE
from sandman.eval.network import offline_policies
from sandman.eval.results import ResultsDir
from sandman.eval.runner import EvalRun, Hooks, Options
from sandman.eval.spec import parse_spec
from sandman.harness.cluster.kwok_nodes import on_kwok
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.process import ManagedProcess, wait_until
from sandman.harness.kube import raw
from sandman.harness.testing import free_port
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
