"""`sandman cluster ...`: the local cluster's lifecycle."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from sandman.harness.cluster.binaries import BuildError, ensure_binaries
from sandman.harness.cluster.config import ClusterConfig, KwokNodeShape, Ports, default_state_dir
from sandman.harness.cluster.hostsetup import HostSetupError
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.process import ComponentFailed
from sandman.harness.images.build import ImageBuildError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cluster", help="the local cluster (real control plane + kwok nodes)")
    csub = p.add_subparsers(dest="cluster_cmd", required=True)

    def state_dir_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--state-dir",
            type=Path,
            default=None,
            help=f"where the cluster keeps its files (default: {default_state_dir()}; "
            "env SANDMAN_STATE_DIR)",
        )

    up = csub.add_parser("up", help="start (or complete) the local cluster; idempotent")
    state_dir_arg(up)
    up.add_argument("--kwok-nodes", type=int, default=None, help="simulated nodes (default 3)")
    up.add_argument("--node-cpu", default=None, help="cpu capacity of each kwok node")
    up.add_argument("--node-memory", default=None, help="memory capacity of each kwok node")
    up.add_argument("--node-pods", type=int, default=None, help="pod capacity of each kwok node")
    up.add_argument(
        "--real-node",
        action="store_true",
        default=None,
        help="add the real node (kubelet + containerd + local registry on 127.0.0.1:5000); "
        "needs root; installs Debian packages it lacks",
    )
    up.add_argument(
        "--deploy",
        action="store_true",
        default=None,
        help="also run Sandman (webhook, reaper, extender, sandman-scheduler): in-cluster on "
        "the real node (images built and pushed to its registry, manifests/overlays/local "
        "applied), else as host processes",
    )
    up.add_argument(
        "--host-components",
        action="store_true",
        default=None,
        help="with --deploy: run Sandman as host processes even with the real node (quick "
        "iteration: no image builds; the same manifests' webhook configurations and policy)",
    )
    up.add_argument(
        "--free-ports",
        action="store_true",
        help="pick unused loopback ports instead of the defaults (new clusters only)",
    )
    up.set_defaults(func=cmd_up)

    down = csub.add_parser("down", help="stop every component the cluster started")
    state_dir_arg(down)
    down.add_argument("--purge", action="store_true", help="also delete the state dir")
    down.set_defaults(func=cmd_down)

    st = csub.add_parser("status", help="components, health and nodes")
    state_dir_arg(st)
    st.add_argument("-o", "--output", choices=["text", "json"], default="text")
    st.set_defaults(func=cmd_status)

    kc = csub.add_parser("kubeconfig", help="print the admin kubeconfig's path")
    state_dir_arg(kc)
    kc.set_defaults(func=cmd_kubeconfig)

    b = csub.add_parser("build", help="build (or find cached) Kubernetes, etcd and kwok binaries")
    b.set_defaults(func=cmd_build)


def _config_from_args(args: argparse.Namespace) -> ClusterConfig:
    state_dir = args.state_dir or default_state_dir()
    saved = ClusterConfig.load(state_dir)
    base = saved or ClusterConfig(state_dir=state_dir)
    if saved is None and args.free_ports:
        base = dataclasses.replace(base, ports=Ports.free())
    shape = base.kwok_node
    shape = KwokNodeShape(
        cpu=args.node_cpu or shape.cpu,
        memory=args.node_memory or shape.memory,
        pods=args.node_pods or shape.pods,
        ephemeral_storage=shape.ephemeral_storage,
    )
    nodes = base.kwok_nodes if args.kwok_nodes is None else args.kwok_nodes
    real = base.real_node
    if args.real_node:
        real = dataclasses.replace(real, enabled=True)
    return dataclasses.replace(
        base,
        state_dir=state_dir,
        kwok_nodes=nodes,
        kwok_node=shape,
        real_node=real,
        deploy_sandman=base.deploy_sandman or bool(args.deploy),
        host_components=(
            base.host_components if args.host_components is None else args.host_components
        ),
    )


def cmd_up(args: argparse.Namespace) -> int:
    cluster = LocalCluster(_config_from_args(args))
    try:
        cluster.up()
    except ComponentFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (BuildError, HostSetupError, ImageBuildError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(cluster.kubeconfig)
    return 0


def _existing(args: argparse.Namespace) -> LocalCluster | None:
    state_dir = args.state_dir or default_state_dir()
    try:
        return LocalCluster.at(state_dir)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


def cmd_down(args: argparse.Namespace) -> int:
    cluster = _existing(args)
    if cluster is None:
        return 0 if args.purge else 1
    stopped = cluster.down(purge=args.purge)
    print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    cluster = _existing(args)
    if cluster is None:
        return 1
    st = cluster.status()
    if args.output == "json":
        print(
            json.dumps(
                {
                    "stateDir": str(st.state_dir),
                    "kubeconfig": str(st.kubeconfig),
                    "server": st.server,
                    "running": st.running,
                    "components": [
                        {"name": c.name, "pid": c.pid, "healthy": c.healthy, "log": str(c.log_file)}
                        for c in st.components
                    ],
                    "nodes": {"ready": st.nodes_ready, "total": st.nodes_total},
                },
                indent=2,
            )
        )
    else:
        print(f"state dir:  {st.state_dir}\nserver:     {st.server}\nkubeconfig: {st.kubeconfig}")
        print(f"{'COMPONENT':<26}{'PID':>8}  HEALTH")
        for c in st.components:
            health = "healthy" if c.healthy else ("unhealthy" if c.pid else "stopped")
            print(f"{c.name:<26}{c.pid or '-':>8}  {health}")
        print(f"nodes: {st.nodes_ready}/{st.nodes_total} Ready")
        if cluster.config.sandman_mode == "in-cluster" and st.running:
            _print_deployments(cluster)
    return 0 if st.running and all(c.healthy for c in st.components) else 3


def _print_deployments(cluster: LocalCluster) -> None:
    from kubernetes.client import AppsV1Api

    from sandman.contract import NAMESPACE
    from sandman.harness.kube import api_client

    apps = AppsV1Api(api_client(cluster.kubeconfig))
    print(f"sandman in-cluster ({NAMESPACE}):")
    for d in apps.list_namespaced_deployment(NAMESPACE).items:
        ready = d.status.available_replicas or 0
        print(f"  {d.metadata.name:<24}{ready}/{d.spec.replicas} available")
    # The node installer has a namespace of its own (sandman-node).
    for ds in apps.list_daemon_set_for_all_namespaces(
        label_selector="app.kubernetes.io/part-of=sandman"
    ).items:
        have, want = ds.status.number_available or 0, ds.status.desired_number_scheduled
        print(f"  {ds.metadata.name:<24}{have}/{want} nodes")


def cmd_kubeconfig(args: argparse.Namespace) -> int:
    cluster = _existing(args)
    if cluster is None:
        return 1
    print(cluster.kubeconfig)
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    cfg = ClusterConfig()
    try:
        bins = ensure_binaries(cfg.cache_dir, cfg.versions)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for name, path in vars(bins).items():
        print(f"{name:<24} {path}")
    return 0
