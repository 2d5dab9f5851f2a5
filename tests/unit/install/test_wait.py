"""How `sandman install` tells a rollout in progress from a pod that cannot start
(worked examples of apply.pod_problem and apply.rolled_out, as the apiserver writes them)."""

from __future__ import annotations

from typing import Any

from sandman.install import apply as ap


def pod(
    status: dict[str, Any], node: str | None = "ip-10-0-1-5", deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "sandman-node-x7k2p", "namespace": "sandman-node"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T18:00:00Z"
    spec = {"nodeName": node} if node else {}
    return {"metadata": meta, "spec": spec, "status": status}


def waiting(reason: str, message: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "initContainerStatuses": [
            {
                "name": "install",
                "state": {"waiting": {"reason": reason, "message": message}},
                **extra,
            }
        ],
    }


def test_an_image_without_this_nodes_platform_is_fatal_at_the_first_pull() -> None:
    msg = (
        'failed to pull and unpack image "ghcr.io/acme/sandman-daemon:0.1.0": no match for '
        "platform in manifest: not found"
    )
    got = ap.pod_problem(pod(waiting("ErrImagePull", msg)))
    assert got is not None and got.fatal
    text = str(got)
    assert text.startswith("pod sandman-node/sandman-node-x7k2p on node ip-10-0-1-5:")
    assert "container install: ErrImagePull" in text and "kubernetes.io/arch" in text


def test_a_pull_error_may_pass_on_retry_but_backoff_is_fatal() -> None:
    first = ap.pod_problem(pod(waiting("ErrImagePull", "dial tcp: i/o timeout")))
    assert first is not None and not first.fatal
    backoff = ap.pod_problem(pod(waiting("ImagePullBackOff", 'Back-off pulling image "x"')))
    assert backoff is not None and backoff.fatal and "ImagePullBackOff" in backoff.reason


def test_a_crash_loop_of_a_binary_of_another_arch_is_fatal_at_once() -> None:
    exec_format = {
        "terminated": {
            "exitCode": 128,
            "reason": "StartError",
            "message": 'exec: "/.sandman/rt/bin/sandmand": exec format error',
        }
    }
    got = ap.pod_problem(
        pod(waiting("CrashLoopBackOff", "back-off 10s", lastState=exec_format, restartCount=1))
    )
    assert got is not None and got.fatal
    assert "(last exit 128, StartError: exec: " in got.reason and "kubernetes.io/arch" in got.reason


def test_any_other_crash_loop_is_fatal_from_the_third_restart() -> None:
    last = {"terminated": {"exitCode": 1, "reason": "Error"}}
    once = ap.pod_problem(pod(waiting("CrashLoopBackOff", "", lastState=last, restartCount=1)))
    assert once is not None and not once.fatal
    thrice = ap.pod_problem(pod(waiting("CrashLoopBackOff", "", lastState=last, restartCount=3)))
    assert thrice is not None and thrice.fatal and "(last exit 1, Error)" in thrice.reason


def test_a_missing_secret_key_is_fatal() -> None:
    got = ap.pod_problem(pod(waiting("CreateContainerConfigError", 'secret "x" not found')))
    assert got is not None and got.fatal


def test_unschedulable_is_said_not_fatal_and_has_no_node() -> None:
    msg = (
        "0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, "
        "2 node(s) didn't match Pod's node affinity/selector."
    )
    status = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg}
        ],
    }
    got = ap.pod_problem(pod(status, node=None))
    assert got is not None and not got.fatal
    assert str(got) == f"pod sandman-node/sandman-node-x7k2p (not scheduled): unschedulable: {msg}"


def test_a_pod_the_kubelet_rejected_is_fatal() -> None:
    status = {
        "phase": "Failed",
        "reason": "NodeAffinity",
        "message": "Predicate NodeAffinity failed",
    }
    got = ap.pod_problem(pod(status))
    assert got is not None and got.fatal and got.node == "ip-10-0-1-5"
    assert got.reason == "NodeAffinity: Predicate NodeAffinity failed"


def test_starting_running_and_deleted_pods_are_no_problem() -> None:
    assert ap.pod_problem(pod(waiting("PodInitializing"))) is None
    assert ap.pod_problem(pod(waiting("ContainerCreating"))) is None
    running = {"phase": "Running", "containerStatuses": [{"name": "c", "state": {"running": {}}}]}
    assert ap.pod_problem(pod(running)) is None
    assert ap.pod_problem(pod(waiting("ImagePullBackOff"), deleting=True)) is None


def deployment(gen: int, observed: int, want: int, **status: int) -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {"name": "sandman-webhook", "generation": gen},
        "spec": {"replicas": want},
        "status": {"observedGeneration": observed, **status},
    }


def test_deployment_rollout_as_kubectl_rollout_status_decides() -> None:
    # Just applied: the controller has not seen the new generation yet.
    assert not ap.rolled_out(
        deployment(2, 1, 2, replicas=2, updatedReplicas=2, availableReplicas=2)
    )
    # A surge pod of the new template is not available yet.
    assert not ap.rolled_out(
        deployment(2, 2, 2, replicas=3, updatedReplicas=1, availableReplicas=2)
    )
    # New pods up, an old one still terminating.
    assert not ap.rolled_out(
        deployment(2, 2, 2, replicas=3, updatedReplicas=2, availableReplicas=3)
    )
    assert ap.rolled_out(deployment(2, 2, 2, replicas=2, updatedReplicas=2, availableReplicas=2))
    # Scaled to zero (the local cluster's reaper in test sessions).
    assert ap.rolled_out(deployment(3, 3, 0))


def test_daemonset_rollout_counts_only_the_nodes_it_may_run_on() -> None:
    def ds(**status: int) -> dict[str, Any]:
        return {
            "kind": "DaemonSet",
            "metadata": {"name": "sandman-node", "generation": 1},
            "status": {"observedGeneration": 1, **status},
        }

    assert ap.rolled_out(ds(desiredNumberScheduled=0))  # no node matches its affinity
    assert not ap.rolled_out(
        ds(desiredNumberScheduled=3, updatedNumberScheduled=3, numberAvailable=2)
    )
    assert ap.rolled_out(ds(desiredNumberScheduled=3, updatedNumberScheduled=3, numberAvailable=3))
