"""The extender's configuration: one dataclass, from flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from sandman.extender.limits import (
    DEFAULT_IMAGE_BYTES,
    NODE_STATUS_MAX_IMAGES,
    REPORT_LAG_S,
    IndexLimits,
)
from sandman.extender.score import CROWD_LIMIT, ScoreParams
from sandman.quantity import parse_quantity
from sandman.serving import add_listen_flag

# A sidecar of the scheduler: only the scheduler in the same pod calls it, so
# it listens on loopback. The port is arbitrary (unused by Kubernetes
# components, which sit at 10248-10259); the scheduler's config names it.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8890


@dataclass(frozen=True)
class ExtenderConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    kubeconfig: Path | None = None  # None: in-cluster service account (or $KUBECONFIG)
    limits: IndexLimits = field(default_factory=IndexLimits)
    score: ScoreParams = field(default_factory=ScoreParams)
    watch: bool = True  # False: serve a caller-filled index (benchmarks, tests)


def add_flags(p: argparse.ArgumentParser) -> None:
    add_listen_flag(p, f"{DEFAULT_HOST}:{DEFAULT_PORT}", "HOST:PORT (HTTP)")
    p.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="default: in-cluster service account (or $KUBECONFIG)",
    )
    p.add_argument(
        "--crowd-limit",
        type=int,
        default=CROWD_LIMIT,
        help="pods of one image on one node before the node is penalised",
    )
    p.add_argument(
        "--node-status-max-images",
        type=int,
        default=NODE_STATUS_MAX_IMAGES,
        help="the kubelets' nodeStatusMaxImages (-1: unlimited); longer lists are truncated",
    )
    p.add_argument(
        "--report-lag",
        type=float,
        default=REPORT_LAG_S,
        help="seconds a new image may take to appear in node.status.images",
    )
    p.add_argument(
        "--default-image-size",
        default=str(DEFAULT_IMAGE_BYTES),
        help="size assumed for images no node reports (quantity, e.g. 1Gi)",
    )


def from_args(args: argparse.Namespace) -> ExtenderConfig:
    host, port = args.listen
    return ExtenderConfig(
        host=host,
        port=port,
        kubeconfig=args.kubeconfig,
        limits=IndexLimits(
            node_status_max_images=args.node_status_max_images,
            report_lag_s=args.report_lag,
            default_image_bytes=int(parse_quantity(args.default_image_size)),
        ),
        score=ScoreParams(crowd_limit=args.crowd_limit),
    )
