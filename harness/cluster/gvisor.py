"""gVisor on the real node: runsc as a second containerd runtime (RuntimeClass ``gvisor``).

What works on these hosts (Debian 12, containerd 1.6.20, root without
CAP_SYS_RESOURCE, cgroup v1; found on 2026-12-01, docs/local-cluster.md):

- runsc and its shim are built from the Go module proxy (the ``gvisor`` set in
  ``binaries``); the shim's main is ours (hack/gvisor/cmd/containerd-shim-runsc-v1)
  because gVisor's fails under containerd 1.6 without CAP_SYS_RESOURCE.
- containerd finds the shim on its PATH (runtime_type ``io.containerd.runsc.v1``
  -> ``containerd-shim-runsc-v1``): the node starts containerd with the gvisor
  bin dir first on PATH. The shim finds runsc through ``binary_name`` in the
  runtime's options file (runsc.toml, re-read at each container create).
- Platform ``systrap`` (KVM fails here: "error setting system registers:
  invalid argument"); network ``sandbox`` (the default: netstack takes over the
  CNI veth).
- ``restrict_oom_score_adj = true`` in the CRI config is required for runsc too
  (runsc's start fails on the pause container's -998).
- runsc bind-mounts a shared empty netns at ``<root>/<namespace>/null-netns``
  and leaves it mounted after its sandboxes are gone: teardown unmounts it.

Pure except ``ensure_runtime_class`` (an API call) and ``teardown`` (host).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient, NodeV1Api
from kubernetes.client.exceptions import ApiException

from sandman.contract import LABEL_NODE_KIND
from sandman.harness.cluster import hostsetup

RUNTIME_CLASS = "gvisor"  # what pods (and a policy's runtimeClassName) name
HANDLER = "runsc"  # the CRI runtime name in containerd's config
RUNTIME_TYPE = "io.containerd.runsc.v1"  # -> binary containerd-shim-runsc-v1
# Measured on this machine (`sandman bench gvisor`, docs/performance.md): an
# idle sandbox's host processes take about 116 MB more (PSS: 140 vs 24 MB)
# under gVisor than under runc (its Sentry and systrap stubs, a gofer per
# container, a second shim). Declared as pod overhead so the scheduler counts
# it and the pod's cgroup limit leaves room for it.
POD_OVERHEAD = {"memory": "120Mi"}


def runsc_toml(runsc: Path, root: Path) -> str:
    """The shim's options file (containerd passes its path as ConfigPath).

    ``root`` is runsc's state dir; the shim appends the containerd namespace
    (``k8s.io``). Debug logging stays off: it costs 25-60 ms per start.
    """
    return f"""binary_name = "{runsc}"
root = "{root}"

[runsc_config]
  platform = "systrap"
  network = "sandbox"
"""


def containerd_runtime(cri: str, runsc_config: Path) -> str:
    """The ``runsc`` runtime section for containerd's CRI plugin (config v2).

    No ``pod_annotations``: ``dev.gvisor.*`` annotations would let whoever
    writes a pod spec change runsc's behaviour per sandbox.
    """
    return f"""    [{cri}.containerd.runtimes.{HANDLER}]
      runtime_type = "{RUNTIME_TYPE}"
      [{cri}.containerd.runtimes.{HANDLER}.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "{runsc_config}"
"""


def containerd_env(shim_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """containerd's environment: the shim's dir first on PATH."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = f"{shim_dir}:{env.get('PATH') or '/usr/sbin:/usr/bin:/sbin:/bin'}"
    return env


def runtime_class() -> dict[str, Any]:
    """RuntimeClass ``gvisor``: only the real node has the handler, so pods
    asking for it are scheduled there (the RuntimeClass admission plugin merges
    the node selector into the pod; a pod pinned to a kwok node is refused)."""
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": RUNTIME_CLASS, "labels": {"app.kubernetes.io/part-of": "sandman"}},
        "handler": HANDLER,
        "overhead": {"podFixed": dict(POD_OVERHEAD)},
        "scheduling": {"nodeSelector": {LABEL_NODE_KIND: "real"}},
    }


def ensure_runtime_class(api: ApiClient) -> None:
    """Create (or converge) the RuntimeClass. Its handler and overhead are
    immutable, so a different existing one is replaced."""
    node = NodeV1Api(api)
    want = runtime_class()
    try:
        node.create_runtime_class(want)
        return
    except ApiException as e:
        if e.status != 409:
            raise
    have = node.read_runtime_class(RUNTIME_CLASS)
    same = (
        have.handler == HANDLER
        and dict((have.overhead.pod_fixed if have.overhead else None) or {}) == POD_OVERHEAD
        and dict((have.scheduling.node_selector if have.scheduling else None) or {})
        == want["scheduling"]["nodeSelector"]
    )
    if not same:
        node.delete_runtime_class(RUNTIME_CLASS)
        node.create_runtime_class(want)


def null_netns_mounts(runsc_root: Path) -> list[Path]:
    return [m for m in hostsetup.mounts_under(runsc_root) if m.name == "null-netns"]


def teardown(runsc_root: Path) -> list[str]:
    """After containerd and its shims are gone: end runsc processes of this
    root, unmount its null-netns and remove its state. Returns what it did."""
    done = []
    # runsc's sandbox, gofer and `runsc wait` processes all carry --root=<root>/<ns>.
    killed = hostsetup.kill_processes_with_arg(f"--root={runsc_root}/")
    if killed:
        done.append(f"killed {len(killed)} runsc processes")
    mounts = null_netns_mounts(runsc_root)
    if mounts:
        hostsetup.unmount_under(runsc_root)  # deepest first; repeats for stacked mounts
        done.append(f"unmounted {len(mounts)} null-netns")
    if runsc_root.exists():
        with contextlib.suppress(OSError):
            shutil.rmtree(runsc_root)
        done.append(f"removed {runsc_root}")
    return done
