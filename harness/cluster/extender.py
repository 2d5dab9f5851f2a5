"""How a cluster runs the extender next to a kube-scheduler (argv and config).

The local cluster starts ``serve_argv(...)`` as a host process and puts
``extender_spec(...)`` into the sandman-scheduler's KubeSchedulerConfiguration
(``sandman.harness.cluster.components.scheduler_config``); the manifests do the same
with a sidecar container (manifests/extender/).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from sandman.extender.config import DEFAULT_HOST
from sandman.harness.cluster.components import scheduler_config, write_yaml
from sandman.harness.cluster.config import ExtenderSpec
from sandman.harness.cluster.process import ManagedProcess

# Our score (0..10) is multiplied by weight x 10 and added to the default
# plugins' (each 0..100 times its weight). At 20, one of our levels is 200
# points: more than the full swing of a weight-1 plugin (NodeResourcesFit,
# BalancedAllocation, ImageLocality, VolumeBinding), as much as a weight-2 one
# (NodeAffinity, PodTopologySpread, InterPodAffinity); only TaintToleration
# (weight 3, PreferNoSchedule taints) swings more. So the tie-break point
# decides among our equals on near-empty nodes, and a node holding the image
# (10) beats an empty one (5) by 1,000 points, more than resource balance
# could ever add back. Cost: resource balance only breaks our ties.
EXTENDER_WEIGHT = 20
# The scheduler waits this long for us per pod, serially: a hung extender
# caps scheduling at 1/timeout pods per second (10/s here) until it answers
# or dies (a dead one fails fast: connection refused). Our p99 is a few ms at
# 1,000 nodes; 100 ms leaves room for a GC pause and a busy 2-core node.
HTTP_TIMEOUT = "100ms"


def url(port: int, host: str = DEFAULT_HOST) -> str:
    return f"http://{host}:{port}"


def extender_spec(
    port: int, *, host: str = DEFAULT_HOST, weight: int = EXTENDER_WEIGHT
) -> ExtenderSpec:
    """The `extenders:` entry of a KubeSchedulerConfiguration for our extender."""
    return ExtenderSpec(
        url_prefix=url(port, host),
        weight=weight,
        http_timeout=HTTP_TIMEOUT,
        node_cache_capable=True,
        ignorable=True,
        filter_verb="",
        prioritize_verb="prioritize",
    )


def serve_argv(
    port: int,
    kubeconfig: Path,
    *,
    host: str = DEFAULT_HOST,
    python: str = sys.executable,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of a host-process extender (`python -m sandman.extender serve`)."""
    return [
        python,
        "-m",
        "sandman.extender",
        "serve",
        f"--listen={host}:{port}",
        f"--kubeconfig={kubeconfig}",
        *extra,
    ]


def ready_url(port: int, host: str = DEFAULT_HOST) -> str:
    """200 once the extender's watches have synced (for a health wait)."""
    return url(port, host) + "/readyz"


def extender_process(
    port: int,
    kubeconfig: Path,
    work_dir: Path,
    *,
    name: str = "sandman-extender",
    extra: Sequence[str] = (),
) -> ManagedProcess:
    """A host-process extender whose pid file and log live under ``work_dir``."""
    return ManagedProcess(
        name,
        tuple(serve_argv(port, kubeconfig, extra=extra)),
        work_dir / "run",
        work_dir / "logs",
        stop_timeout_s=5,
    )


def scheduler_process(
    binary: Path,
    kubeconfig: Path,
    work_dir: Path,
    *,
    name: str,
    port: int,
    extenders: tuple[ExtenderSpec, ...] = (),
) -> ManagedProcess:
    """One more kube-scheduler (stock binary) with a single profile ``name``.

    For tests and benchmarks next to a running cluster: its config, certs,
    pid file and log all live under ``work_dir``; leader election is off.
    """
    conf = write_yaml(work_dir / f"{name}.yaml", scheduler_config(name, kubeconfig, extenders))
    argv = (
        str(binary),
        f"--config={conf}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={work_dir / (name + '-certs')}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--v=1",
    )
    return ManagedProcess(name, argv, work_dir / "run", work_dir / "logs", stop_timeout_s=5)
