"""Reading nodes and pods as the watch delivers them."""

from __future__ import annotations

from typing import Any

from sandman.extender.observe import (
    ContainerImage,
    ImageEntry,
    node_report,
    pod_report,
    pod_requests,
)

TASK = "127.0.0.1:5000/swe/task-1:v1"
DAEMON = "127.0.0.1:5000/sandman/daemon:0.1.0"
DIGEST = "sha256:" + "ef" * 32


def pod(statuses: list[dict[str, Any]] | None = None, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {
            "nodeName": "n1",
            "initContainers": [{"name": "init", "image": DAEMON}],
            "containers": [{"name": "main", "image": TASK}],
        },
        "status": {"containerStatuses": statuses or [], **status},
    }


def test_node_report_keeps_names_and_sizes() -> None:
    node = {
        "metadata": {"name": "n1"},
        "status": {
            "images": [
                {"names": [f"127.0.0.1:5000/swe/task-1@{DIGEST}", TASK], "sizeBytes": 3_000_000},
                {"names": [], "sizeBytes": 5},  # nameless: nothing to match on
                {"names": [DAEMON]},  # no size
            ]
        },
    }
    r = node_report(node)
    assert r.node == "n1"
    assert r.entries == (
        ImageEntry((f"127.0.0.1:5000/swe/task-1@{DIGEST}", TASK), 3_000_000),
        ImageEntry((DAEMON,), 0),
    )
    assert node_report({"metadata": {"name": "n2"}}).entries == ()


def test_unbound_pod_has_no_report() -> None:
    p = pod()
    del p["spec"]["nodeName"]
    assert pod_report(p) is None


def test_bound_not_started_is_pending_app_containers_first() -> None:
    r = pod_report(pod(phase="Pending"))
    assert r is not None
    assert r.node == "n1" and r.uid == "u1" and r.active
    assert r.images == (ContainerImage(TASK, "pending"), ContainerImage(DAEMON, "pending"))


def test_running_with_image_id() -> None:
    st = [
        {
            "name": "main",
            "imageID": f"127.0.0.1:5000/swe/task-1@{DIGEST}",
            "state": {"running": {}},
        }
    ]
    r = pod_report(
        pod(
            st,
            phase="Running",
            initContainerStatuses=[{"name": "init", "state": {"terminated": {"exitCode": 0}}}],
        )
    )
    assert r is not None
    assert r.images == (
        ContainerImage(TASK, "started", f"127.0.0.1:5000/swe/task-1@{DIGEST}"),
        ContainerImage(DAEMON, "started"),
    )


def test_pull_failures_and_terminal_pods_pull_nothing() -> None:
    st = [{"name": "main", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]
    r = pod_report(pod(st, phase="Pending"))
    assert r is not None and r.images[0].state == "failed"
    r = pod_report(pod([{"name": "main", "state": {"waiting": {}}}], phase="Failed"))
    assert r is not None and not r.active
    assert [c.state for c in r.images] == ["failed", "failed"]
    r = pod_report(pod([], phase="Succeeded"))
    assert r is not None and [c.state for c in r.images] == ["started", "started"]


def test_creating_is_pending() -> None:
    st = [{"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}}}]
    r = pod_report(pod(st, phase="Pending"))
    assert r is not None and r.images[0].state == "pending"


def test_requests_are_distinct_app_first() -> None:
    p = pod()
    p["spec"]["containers"].append({"name": "side", "image": TASK})
    assert pod_requests(p) == (TASK, DAEMON)
