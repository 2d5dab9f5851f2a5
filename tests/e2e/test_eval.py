"""`sandman eval run` on the real node: a 10-task spec, scored exactly, twice the same.

The spec is the bundled example (examples/eval/calc.yaml: the `swe` image's
calc repository with right, wrong, partial and unappliable patches, and two
tasks on `tiny`, one of them showing that offline tasks are offline) plus:
an image that does not exist (an infrastructure failure after the configured
attempts, never a score), a task that runs out of time (scored 0), and a task
whose daemon is killed from the host before its tests run (retried in a new
sandbox, then scored; it also asks for network and gets it).

The eval profile selects the real node the way a dedicated-node profile
does (a policy rule for the test's namespace), and the namespace gets
manifests/sandbox-namespace, as a production namespace would.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.client import SandmanClient
from sandman.client.errors import DaemonError
from sandman.contract import ANN_PROFILE, LABEL_NODE_KIND, LABEL_SANDBOX
from sandman.eval.compare import compare
from sandman.eval.results import ResultsDir, read_records
from sandman.eval.runner import EvalRun, Hooks, Options
from sandman.eval.spec import parse_spec
from sandman.eval.summary import summarize
from sandman.harness.cluster.deploy import MANIFESTS
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.kube import raw
from sandman.harness.testing import async_wait_for, kubectl, wait_for
from sandman.registry import RegistryClient

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "eval" / "calc.yaml"
POLICY_LABEL = "sandman.dev/policy-test"
RULE = "test-eval"
DEDICATED = {LABEL_NODE_KIND: "real"}  # the eval profile's nodeSelector in this test
ATTEMPTS = 3
# What every task must come to, run after run (status, reason); "missing" is
# a hole in the result, never a score.
EXPECTED = {
    "calc-fix": ("pass", "tests_passed"),
    "calc-fix-files": ("pass", "tests_passed"),
    "calc-breaks-add": ("fail", "tests_failed"),
    "calc-no-change": ("fail", "tests_failed"),
    "calc-bad-patch": ("fail", "apply_failed"),
    "tiny-answer": ("pass", "exit_code_zero"),
    "tiny-offline": ("pass", "exit_code_zero"),
    "missing": ("infra_failed", "ImageNotFound"),
    "timeout": ("fail", "timeout"),
    "killed": ("pass", "exit_code_zero"),
}
REGISTRY_ON_BRIDGE = (
    "printf 'GET /v2/ HTTP/1.0\\r\\n\\r\\n' | nc -w 3 10.244.0.1 5000 | grep -q HTTP/1"
)


def spec_text(images: dict[str, str]) -> str:
    doc = yaml.safe_load(EXAMPLE.read_text())
    tiny = {"image": images["tiny"], "workdir": "/", "resources": {"cpu": "100m", "memory": "64Mi"}}
    doc["tasks"] += [
        {"id": "missing", **tiny, "image": "127.0.0.1:5000/sandman/eval-missing:1",
         "test": {"command": "true"}},
        {"id": "timeout", **tiny, "timeout": "5s", "test": {"command": "sleep 600"}},
        {"id": "killed", **tiny, "network": True, "test": {"command": REGISTRY_ON_BRIDGE}},
    ]  # fmt: skip
    assert [t["id"] for t in doc["tasks"]] == list(EXPECTED)
    return yaml.safe_dump(doc, sort_keys=False)


@contextmanager
def eval_policy(
    cluster: LocalCluster,
    core: CoreV1Api,
    namespace: str,
    image: str,
    eval_profile: dict[str, Any] | None = None,
) -> Iterator[None]:
    """A rule for the test's namespace whose eval profile selects the real node
    (``eval_profile``: that profile instead)."""
    handle = cluster.deployment.policy  # type: ignore[union-attr]
    original = handle.read()
    doc = yaml.safe_load(original)
    rules = doc.get("rules") or []
    base = next((r for r in rules if "namespaceSelector" not in r), rules[-1])
    rule = copy.deepcopy(base)
    rule["name"] = RULE
    rule["namespaceSelector"] = {"matchLabels": {POLICY_LABEL: "eval"}}
    rule.setdefault("profiles", {}).setdefault("eval", {})["nodeSelector"] = DEDICATED
    if eval_profile is not None:
        rule["profiles"]["eval"] = eval_profile
    want = (eval_profile or {}).get("tolerations") or []
    doc["rules"] = [rule, *[r for r in rules if r.get("name") != RULE]]
    handle.write(yaml.safe_dump(doc, sort_keys=False))
    core.patch_namespace(namespace, {"metadata": {"labels": {POLICY_LABEL: "eval"}}})
    probe = {
        "metadata": {"generateName": "probe-", "labels": {LABEL_SANDBOX: "true"},
                     "annotations": {ANN_PROFILE: "eval"}},
        "spec": {"containers": [{"name": "main", "image": image, "command": ["true"],
                                 "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}}}]},
    }  # fmt: skip

    def selected() -> bool:  # the webhook learns namespace labels by watch
        try:
            got = raw(core.create_namespaced_pod(namespace, probe, dry_run="All",
                                                 _preload_content=False))  # fmt: skip
        except ApiException:
            return False
        if eval_profile is not None:
            return all(t in (got["spec"].get("tolerations") or []) for t in want)
        return got["spec"].get("nodeSelector") == DEDICATED

    try:
        wait_for(selected, timeout=60, what="eval sandboxes admitted with the rule's eval profile")
        yield
    finally:
        handle.write(original)


def kill_daemon(real_node: RealNode, pod: str) -> int:
    """SIGKILL the sandbox's PID 1 (the daemon) from the host; returns its host pid."""
    (sandbox_id,) = real_node.crictl("pods", "-q", "--name", f"^{pod}$").split()
    (cid,) = real_node.crictl("ps", "-q", "--pod", sandbox_id, "--name", "^main$").split()
    pid = int(json.loads(real_node.crictl("inspect", cid))["info"]["pid"])
    os.kill(pid, signal.SIGKILL)
    return pid


def dead(pid: int) -> bool:
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


def outcomes(records: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {r["task"]: (r["status"], r["reason"]) for r in records}


async def test_eval_run_scores_exactly_retries_infrastructure_and_repeats(
    cluster: LocalCluster,
    core: CoreV1Api,
    real_node: RealNode,
    namespace: str,
    images: dict[str, str],
    tmp_path: Path,
) -> None:
    # The local ranges (pods, services; the node on the pod bridge): the shipped
    # policies with the overlay a production namespace would apply.
    local = MANIFESTS / "overlays" / "local" / "sandbox-namespace"
    kubectl(cluster, "apply", "-n", namespace, "-k", str(local))
    spec_file = tmp_path / "calc10.yaml"
    spec_file.write_text(spec_text(images))
    spec = parse_spec(spec_file.read_bytes(), name="calc10", jsonl=False)
    first = ResultsDir(tmp_path / "first")
    killed: list[int] = []
    refused_reset: list[str] = []

    async def before_phase(a: Any, phase: str) -> None:
        if a.task.id == "killed" and a.number == 1 and phase == "test":
            pid = kill_daemon(real_node, a.sandbox.name)
            await async_wait_for(lambda: dead(pid), timeout=30, what="the daemon gone")
            killed.append(pid)
        if a.task.id == "calc-fix" and phase == "test":
            with pytest.raises(DaemonError) as e:  # no reuse: reset is refused
                await a.sandbox.reset()
            refused_reset.append(e.value.code)

    with eval_policy(cluster, core, namespace, images["tiny"]):
        async with SandmanClient(kubeconfig=cluster.kubeconfig, namespace=namespace) as client:
            async with RegistryClient() as rc:
                opts = Options(namespace=namespace, concurrency=4, attempts=ATTEMPTS)
                result = await EvalRun(client, spec, first, opts, registry=rc,
                                       hooks=Hooks(before_phase=before_phase)).run()  # fmt: skip
                digests = {
                    ref: await rc.resolve_digest(ref) for ref in (images["tiny"], images["swe"])
                }

            # Scored tasks are exact; the missing image is a hole after every attempt.
            assert outcomes(result.records) == EXPECTED, result.text
            assert killed and refused_reset == ["reset_disabled"]
            by = {r["task"]: r for r in result.records}
            miss = by["missing"]
            assert (
                miss["score"] is None
                and miss["attempts"] == ATTEMPTS
                and miss["image_digest"] is None
            )
            k = by["killed"]
            assert k["attempts"] == 2 and k["retried"] and k["score"] == 1
            assert k["retries"][0]["phase"] == "test" and k["retries"][0]["reason"] == "Unreachable"
            assert [r["task"] for r in result.records if r["attempts"] > 1] == ["missing", "killed"]
            assert by["timeout"]["detail"]["exit_codes"] == [-9]  # killed at the deadline
            assert by["calc-breaks-add"]["detail"]["not_passed"] == [
                "tests.test_ops.OpsTest.test_add"
            ]
            # Every scored task ran under the controlled conditions, as recorded.
            for r in result.records:
                if r["status"] == "infra_failed":
                    continue
                c, v = r["conditions"], r["versions"]
                assert r["image_digest"] == digests[r["image"]], r
                assert c["image_id"].endswith("@" + r["image_digest"])
                assert c["qos_class"] == "Guaranteed" and c["no_reset"], c
                assert c["node"] == real_node.node.name and c["node_selector"] == DEDICATED
                assert c["resources"]["requests"] == c["resources"]["limits"]
                assert c["env"]["PYTHONHASHSEED"] == "0" and c["env"]["TZ"] == "UTC"
                assert c["network"] == ("allowed" if r["task"] == "killed" else "none")
                assert v["daemon"] and v["kubelet"] == v["kubernetes"] == "v1.34.4", v
            logs = first.root / by["calc-fix"]["logs"]
            test_log = next(logs.glob("*-test.stderr")).read_text()
            assert "test_mean (tests.test_ops.OpsTest.test_mean) ... ok" in test_log
            # The summary and the JSON agree.
            records = read_records(first.root)
            summary = json.loads((first.root / "summary.json").read_text())
            assert summary == summarize(records, max_attempts=ATTEMPTS) == result.summary
            assert (summary["scored"], summary["passed"], summary["infra_failed"]) == (9, 5, 1)
            assert summary["line"] == f"9 scored, 1 infra-failed after {ATTEMPTS} attempts"
            assert summary["line"] in (first.root / "summary.txt").read_text()
            assert summary["failures"]["infra_failed"] == {"ImageNotFound": 1}
            # kube-router enforces the offline policy: the canary from the first
            # offline sandbox could not reach the apiserver's Service.
            net = first.load_run()["network"]
            assert net["network"] == "verified" and net["canary"] == "blocked", net
            assert by["tiny-offline"]["conditions"]["network_check"] == "verified"

            # Resuming runs only what could not be scored.
            again: list[str] = []
            resumed = await EvalRun(
                client, spec, first, Options(namespace=namespace, attempts=ATTEMPTS, resume=True),
                hooks=Hooks(on_record=lambda rec: again.append(rec["task"])),
            ).run()  # fmt: skip
            assert again == ["missing"] and outcomes(resumed.records) == EXPECTED

        # A second run, from the command line, gives the same scores.
        second = tmp_path / "second"
        proc = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "sandman.cli.main", "eval", "run", str(spec_file), "-o",
             str(second), "-n", namespace, "--kubeconfig", str(cluster.kubeconfig),
             "--attempts", str(ATTEMPTS)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    print(proc.stdout)  # the summary table, for the record
    assert proc.returncode == 2, proc.stderr[-3000:]  # the missing image: the result has holes
    assert f"9 scored, 1 infra-failed after {ATTEMPTS} attempts" in proc.stdout, proc.stdout
    assert outcomes(read_records(second)) == EXPECTED
    same = compare(read_records(first.root), read_records(second))
    assert same["changed"] == [] and same["paired"] == 9 and same["p_value"] == 1.0


def shipped_eval_profile() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "manifests" / "webhook" / "policy.yaml").read_text())
    rules = yaml.safe_load(doc["data"]["policy.yaml"])["rules"]
    base = next((r for r in rules if "namespaceSelector" not in r), rules[-1])
    return dict(base["profiles"]["eval"])


async def test_a_fresh_install_scores_on_shared_nodes_and_records_it(
    cluster: LocalCluster,
    core: CoreV1Api,
    real_node: RealNode,
    namespace: str,
    images: dict[str, str],
    tmp_path: Path,
) -> None:
    """The shipped eval profile, no node labelled sandman.dev/dedicated=eval:
    the tasks are scored on the (shared) real node, and the run says so."""
    tiny = {"image": images["tiny"], "workdir": "/", "network": True,
            "resources": {"cpu": "100m", "memory": "64Mi"}}  # fmt: skip
    text = yaml.safe_dump({"name": "fresh", "tasks": [
        {"id": "answer", **tiny, "apply": {"command": "echo 42 > /tmp/answer"},
         "test": {"command": 'test "$(cat /tmp/answer)" = 42'}},
        {"id": "wrong", **tiny, "test": {"command": "false"}},
    ]})  # fmt: skip
    spec = parse_spec(text.encode(), name="fresh", jsonl=False)
    out = ResultsDir(tmp_path / "fresh")
    with eval_policy(cluster, core, namespace, images["tiny"], shipped_eval_profile()):
        async with (
            SandmanClient(kubeconfig=cluster.kubeconfig, namespace=namespace) as client,
            RegistryClient() as rc,
        ):
            result = await EvalRun(
                client, spec, out, Options(namespace=namespace), registry=rc
            ).run()
    assert outcomes(result.records) == {
        "answer": ("pass", "exit_code_zero"),
        "wrong": ("fail", "exit_code"),
    }, result.text
    why = "no node is labelled sandman.dev/dedicated=eval (dedicated to profile 'eval')"
    for r in result.records:
        c = r["conditions"]
        assert c["node"] == real_node.node.name and c["dedicated_node"] is False, c
        assert c["placement"] == "shared" and c["placement_reason"] == why
    placement = out.load_run()["placement"]
    assert placement["dedicated_nodes"] is False and placement["pinned"] == {}
    assert (
        f"kubectl label node {real_node.node.name} sandman.dev/dedicated=eval" in (placement["fix"])
    )
    assert result.summary["conditions"]["on_shared"] == 2
    assert f"dedicated nodes: no: 2 of 2 tasks ran on shared nodes ({why})" in result.text
