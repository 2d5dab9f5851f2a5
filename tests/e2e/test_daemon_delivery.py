"""How the daemon reaches a sandbox, on the real node through the webhook.

- The default delivery (a copy of the runtime tree per pod) in a busybox-only
  image and in the Debian `swe` image: one daemon process, PID 1, run from the
  tree the init container copied, answering commands.
- The shared delivery (a policy rule's ``daemonDelivery: shared``): two
  sandboxes run the same files from the node directory, and a root agent in
  one of them cannot change what the other runs.
- The node delivery (``daemonDelivery: node``): no install step at all; the
  tree the node installer (DaemonSet sandman-node) placed is mounted
  read-only where the daemon runs from, the same inode in both sandboxes,
  and a root agent cannot change it.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman import tokens
from sandman.contract import DAEMON_ARGV, LABEL_ID, LABEL_NODE_KIND, LABEL_SANDBOX
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.kube import raw
from sandman.harness.testing import policy_rule, wait_for, wait_ready
from sandman.webhook.mutate import DEFAULT_SHARED_DIR, delivery_of
from tests.e2e.test_sandbox import call, namespace_key

POLICY_LABEL = "sandman.dev/policy-test"
NODE_DIR = Path(DEFAULT_SHARED_DIR)  # the webhook's --daemon-shared-dir default


def _pod(name: str, image: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {LABEL_SANDBOX: "true"}},
        "spec": {
            "nodeSelector": {LABEL_NODE_KIND: "real"},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "command": ["sleep", "3600"]}],
        },
    }


def _sandboxes(
    core: CoreV1Api, namespace: str, image: str, names: tuple[str, ...]
) -> list[tuple[dict[str, Any], str]]:
    """Create sandboxes; (pod, token) of each once Ready."""
    for name in names:
        core.create_namespaced_pod(namespace, _pod(name, image))
    key = namespace_key(core, namespace)
    out = []
    for name in names:
        pod = wait_ready(core, namespace, name, timeout=120)
        out.append((pod, tokens.sandbox_token(key, pod["metadata"]["labels"][LABEL_ID])))
    return out


def sh(pod: dict[str, Any], token: str, cmd: str) -> dict[str, Any]:
    status, r = call(pod["status"]["podIP"], token, "/v1/exec", {"cmd": cmd})
    assert status == 200, r
    return r


# -- the default delivery ----------------------------------------------------------
@pytest.mark.parametrize("image_name", ["tiny", "swe"])
def test_copied_tree_runs_the_daemon_as_pid1_in_any_image(
    real_node: RealNode,
    core: CoreV1Api,
    namespace: str,
    images: dict[str, str],
    image_name: str,
) -> None:
    ((pod, token),) = _sandboxes(core, namespace, images[image_name], ("a",))
    # The install step ran and ended; it passes Pod Security `restricted`.
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 0, init
    r = sh(pod, token, "echo $((6*7)); tr '\\0' ' ' < /proc/1/cmdline")
    answer, cmdline = r["stdout"].splitlines()
    assert answer == "42"
    # PID 1 is the tree's interpreter itself (no bootloader, nothing unpacked).
    assert cmdline.split()[: len(DAEMON_ARGV)] == list(DAEMON_ARGV), cmdline
    # One daemon process in the sandbox (the old build ran three).
    r = sh(pod, token, "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done")
    daemons = [ln for ln in r["stdout"].splitlines() if ln.startswith(DAEMON_ARGV[0])]
    assert len(daemons) == 1, r["stdout"]
    r = sh(pod, token, "ls -A /.sandman; test -L /.sandman/rt || echo copied; du -sk /.sandman/rt")
    lines = r["stdout"].splitlines()
    assert "rt" in lines and "copied" in lines, r
    size_kib = int(lines[-1].split()[0])
    print(f"[{image_name}] /.sandman/rt: {size_kib / 1024:.1f} MiB per pod (copy mode)")


# -- the shared delivery -----------------------------------------------------------
def _delivered_sandboxes(
    cluster: LocalCluster,
    core: CoreV1Api,
    namespace: str,
    image: str,
    delivery: str,
    names: tuple[str, ...],
) -> list[tuple[dict[str, Any], str]]:
    """Sandboxes of ``namespace`` started with ``delivery``: a rule choosing it
    for the namespace's label (a copy of the cluster's default rule
    otherwise), prepended while they are created."""
    label = f"{delivery}-daemon"
    with policy_rule(cluster, f"test-{label}", {POLICY_LABEL: label}, daemonDelivery=delivery):
        core.patch_namespace(namespace, {"metadata": {"labels": {POLICY_LABEL: label}}})
        wait_for(
            lambda: _dry_run_delivery(core, namespace, image) == delivery,
            timeout=60,
            what=f"the webhook to choose the {delivery} delivery for the namespace",
        )
        return _sandboxes(core, namespace, image, names)


def _dry_run_delivery(core: CoreV1Api, namespace: str, image: str) -> str:
    """The delivery the webhook gives a sandbox of ``namespace`` now ("?" if
    it cannot be asked)."""
    try:
        got = raw(
            core.create_namespaced_pod(
                namespace, _pod("probe", image), dry_run="All", _preload_content=False
            )
        )
    except ApiException:
        return "?"
    return delivery_of(got)


# What a root agent in a sandbox tries against the node's shared tree (and the
# message that must stop each). KEY is the tree's directory name.
ATTACKS = {
    "append": "echo pwned >> /.sandman/shared/KEY/rt/VERSION",
    "truncate": ": > /.sandman/shared/KEY/rt/bin/sandmand",
    "chmod": "chmod u+w /.sandman/shared/KEY/rt/bin/sandmand",
    "rename": "mv /.sandman/shared/KEY/rt/bin/sandmand /.sandman/shared/KEY/rt/bin/x",
    "remove": "rm -rf /.sandman/shared/KEY",
    "create": "touch /.sandman/shared/KEY/rt/evil",
    "remount": "mount -o remount,rw /.sandman/shared",
    "bind": "mkdir -p /tmp/evil && mount --bind /tmp/evil /.sandman/shared/KEY/rt/bin",
    "unmount": "umount /.sandman/shared",
    "hardlink": "ln /.sandman/shared/KEY/rt/bin/sandmand /tmp/h && echo x >> /tmp/h",
    "user-namespace": "unshare -Urm sh -c 'mount -o remount,rw,bind /.sandman/shared && "
    "echo pwned >> /.sandman/shared/KEY/rt/VERSION'",
}


def _tree_digest(pod: dict[str, Any], token: str, key: str) -> str:
    return _tree_digest_at(pod, token, f"/.sandman/shared/{key}/rt")


def test_shared_delivery_two_sandboxes_one_tree_that_neither_can_change(
    cluster: LocalCluster,
    real_node: RealNode,
    core: CoreV1Api,
    namespace: str,
    images: dict[str, str],
) -> None:
    existed = {p.name for p in NODE_DIR.iterdir()} if NODE_DIR.is_dir() else None
    (a, token_a), (b, token_b) = _delivered_sandboxes(
        cluster, core, namespace, images["tiny"], "shared", ("a", "b")
    )
    try:
        both = ((a, token_a), (b, token_b))
        links = [sh(p, t, "readlink /.sandman/rt")["stdout"].strip() for p, t in both]
        assert links[0] == links[1] and links[0].startswith("/.sandman/shared/"), links
        key = links[0].split("/")[3]
        # The same files: the daemon's executable is one inode on one device.
        ident = [
            sh(p, t, f"stat -L -c '%d:%i' /.sandman/shared/{key}/rt/bin/sandmand")["stdout"]
            for p, t in both
        ]
        assert ident[0] == ident[1], ident
        # Nothing of the daemon's was copied into the pods: a symlink and state
        # (the node directory is mounted inside /.sandman: not counted).
        own = "cd /.sandman && du -sk $(ls -A | grep -vx shared) | awk '{s += $1} END {print s}'"
        kib = int(sh(a, token_a, own)["stdout"])
        assert kib < 1024, f"{kib} KiB in the pod's own /.sandman"
        before = _tree_digest(a, token_a, key)

        # A root agent in b tries everything it can against the shared tree.
        for what, cmd in ATTACKS.items():
            r = sh(b, token_b, cmd.replace("KEY", key))
            assert r["exit_code"] != 0, (what, r)
            said = r["stderr"].lower()
            why = ("read-only", "denied", "not permitted", "cross-device", "invalid argument")
            assert any(m in said for m in why), (what, r)
        # Through the daemon's file API too.
        status, doc = call(
            b["status"]["podIP"],
            token_b,
            "/v1/files/remove",
            {"path": f"/.sandman/shared/{key}/rt/VERSION"},
        )
        assert status == 403, doc
        # b may repoint its own link: that changes only its own pod.
        sh(b, token_b, "ln -sfn /tmp /.sandman/rt")

        assert _tree_digest(a, token_a, key) == before
        assert sh(a, token_a, "readlink /.sandman/rt")["stdout"].strip() == links[0]
        assert sh(a, token_a, "echo still-serving")["stdout"] == "still-serving\n"
        # On the node: the tree has no write bit, the directory is root's alone.
        shared = NODE_DIR / key / "rt"
        for p in [shared, *shared.rglob("*")]:
            st = p.lstat()
            assert (st.st_uid == 0 and not stat.S_IMODE(st.st_mode) & 0o222) or p.is_symlink(), p
        top = NODE_DIR.stat()
        assert top.st_uid == 0 and not stat.S_IMODE(top.st_mode) & 0o022, oct(top.st_mode)
    finally:
        for name in ("a", "b"):
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        if existed is None:
            shutil.rmtree(NODE_DIR, ignore_errors=True)  # the kubelet made it for this test
        else:
            for child in NODE_DIR.iterdir():  # only what this test installed
                if child.name not in existed:
                    shutil.rmtree(child, ignore_errors=True)


# -- the node delivery -------------------------------------------------------------

# What a root agent tries against the node's tree mounted at /.sandman/rt.
NODE_ATTACKS = {
    "append": "echo pwned >> /.sandman/rt/VERSION",
    "truncate": ": > /.sandman/rt/bin/sandmand",
    "chmod": "chmod u+w /.sandman/rt/bin/sandmand",
    "create": "touch /.sandman/rt/evil",
    "remove": "rm -rf /.sandman/rt/lib",
    "move-away": "mv /.sandman/rt /.sandman/old",
    "remount": "mount -o remount,rw /.sandman/rt",
    "unmount": "umount /.sandman/rt",
    "bind": "mkdir -p /tmp/evil && mount --bind /tmp/evil /.sandman/rt/bin",
    "hardlink": "ln /.sandman/rt/bin/sandmand /tmp/h && echo x >> /tmp/h",
}


def test_node_delivery_runs_the_nodes_tree_with_no_install_step_and_none_can_change_it(
    cluster: LocalCluster,
    real_node: RealNode,
    core: CoreV1Api,
    namespace: str,
    images: dict[str, str],
) -> None:
    (a, token_a), (b, token_b) = _delivered_sandboxes(
        cluster, core, namespace, images["tiny"], "node", ("na", "nb")
    )
    try:
        both = ((a, token_a), (b, token_b))
        for p, _ in both:
            assert not p["spec"].get("initContainers"), p["spec"].get("initContainers")
            assert not (p["status"].get("initContainerStatuses") or [])
        # The tree the node installer named for the injected image, one inode for both.
        vol = next(v for v in a["spec"]["volumes"] if v["name"] == "sandman-daemon-shared")
        release = Path(vol["hostPath"]["path"])
        assert release.parent == NODE_DIR / "release" and release.is_dir(), release
        ident = [
            sh(p, t, "stat -L -c '%d:%i' /.sandman/rt/bin/sandmand")["stdout"] for p, t in both
        ]
        assert ident[0] == ident[1], ident
        assert f"{(release / 'bin' / 'sandmand').stat().st_ino}" == ident[0].split(":")[1].strip()
        # PID 1 is the daemon, run from that tree.
        cmdline = sh(a, token_a, "tr '\\0' ' ' < /proc/1/cmdline")["stdout"]
        assert cmdline.startswith(DAEMON_ARGV[0]), cmdline
        # Nothing of the daemon's in the pod's own /.sandman (the mount is not counted).
        own = (
            "cd /.sandman && ls -A | grep -vx rt | xargs -r du -sk"
            " | awk '{s += $1} END {print s + 0}'"
        )
        kib = int(sh(a, token_a, own)["stdout"])
        assert kib < 1024, f"{kib} KiB in the pod's own /.sandman"
        before = _tree_digest_at(a, token_a, "/.sandman/rt")

        for what, cmd in NODE_ATTACKS.items():
            r = sh(b, token_b, cmd)
            assert r["exit_code"] != 0, (what, r)
            said = r["stderr"].lower()
            why = ("read-only", "denied", "not permitted", "cross-device", "busy", "invalid")
            assert any(m in said for m in why), (what, r)
        status, doc = call(
            b["status"]["podIP"], token_b, "/v1/files/remove", {"path": "/.sandman/rt/VERSION"}
        )
        assert status == 403, doc

        assert _tree_digest_at(a, token_a, "/.sandman/rt") == before
        assert _tree_digest_at(b, token_b, "/.sandman/rt") == before
        assert sh(a, token_a, "echo still-serving")["stdout"] == "still-serving\n"
    finally:
        for name in ("na", "nb"):
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def _tree_digest_at(pod: dict[str, Any], token: str, root: str) -> str:
    r = sh(pod, token, f"cd {root} && find . -type f | sort | xargs sha256sum")
    assert r["exit_code"] == 0 and r["stdout"], r
    return hashlib.sha256(r["stdout"].encode()).hexdigest()
