"""`down` of the real node leaves nothing behind, and `up` brings it back (Sandman too).

Runs against the session's own cluster (skipped on a reused one, which is
somebody else's): the node is taken down with a pod running on it, checked for
leftovers, and started again for whatever runs next.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes.client import CoreV1Api

from sandman.harness.cluster import gvisor, hostsetup
from sandman.harness.cluster.node import RealNode
from sandman.harness.testing import ClusterBed, real_pod, wait_ready


def netns_names() -> set[str]:
    d = Path("/var/run/netns")
    return {p.name for p in d.iterdir()} if d.exists() else set()


def test_down_leaves_no_mounts_netns_veths_or_processes(
    testbed: ClusterBed,
    real_node: RealNode,
    core: CoreV1Api,
    namespace: str,
    images: dict[str, str],
) -> None:
    if not testbed.owned:
        pytest.skip("takes the real node down: only on the session's own cluster")
    netns_before = netns_names()
    core.create_namespaced_pod(namespace, real_pod("victim", images["tiny"]))
    # And one under gVisor: runsc leaves processes and a null-netns mount of its own.
    gv = real_pod("victim-gvisor", images["tiny"])
    gv["spec"]["runtimeClassName"] = gvisor.RUNTIME_CLASS
    core.create_namespaced_pod(namespace, gv)
    wait_ready(core, namespace, "victim")
    wait_ready(core, namespace, "victim-gvisor")
    assert len(netns_names() - netns_before) == 2
    assert gvisor.null_netns_mounts(real_node.lay.runsc_root)
    assert hostsetup.pids_with_arg(f"--root={real_node.lay.runsc_root}/")
    veths = hostsetup.veths_on(real_node.node.bridge)
    assert veths

    down_at = datetime.now(UTC)
    stopped = real_node.down()

    assert {"kubelet", "containerd", "registry"} <= set(stopped)
    state = str(real_node.lay.root)
    assert hostsetup.mounts_under(real_node.lay.root) == []
    assert netns_names() - netns_before == set()
    assert not hostsetup.bridge_exists(real_node.node.bridge)
    assert not [v for v in veths if Path(f"/sys/class/net/{v}").exists()]
    assert hostsetup.pids_with_arg(state) == []
    assert hostsetup.pids_with_arg(str(real_node.lay.containerd_socket)) == []
    assert not real_node.lay.runsc_root.exists()  # runsc's state went with its mounts
    for mount in hostsetup.cgroup_mounts():
        assert not (mount / real_node.node.cgroup_root.lstrip("/")).exists()

    # Back up for the rest of the session; the pod comes back with the node.
    real_node.up()
    # Until the kubelet reports again, the pods' statuses are the ones from
    # before the restart (Ready): only containers started since count.
    for name in ("victim", "victim-gvisor"):
        wait_ready(core, namespace, name, timeout=120, started_after=down_at)
    # Sandman's own pods come back with the node too, in no particular order:
    # the rest of the session creates sandboxes through its webhook.
    deployment = testbed.cluster.deployment
    assert deployment is not None
    deployment.wait_restarted(down_at)
