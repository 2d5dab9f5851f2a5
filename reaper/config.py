"""The reaper's configuration: one dataclass, from flags and environment."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandman.contract import NAMESPACE, parse_duration
from sandman.leader import LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD
from sandman.reaper.controller import ReaperOptions
from sandman.reaper.decide import StuckLimits
from sandman.serving import add_listen_flag

LEASE_NAME = "sandman-reaper"


@dataclass(frozen=True)
class ReaperConfig:
    host: str = "0.0.0.0"
    port: int = 8080  # health and metrics (plain HTTP)
    kubeconfig: Path | None = None
    namespace: str = NAMESPACE  # the Lease lives here
    keys_namespace: str = NAMESPACE  # Secret sandman-admission-key lives here
    webhook_config: str = "sandman"  # the ValidatingWebhookConfiguration to probe
    webhook_name: str = "policy.sandman.dev"  # its webhook that admits lease extensions
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    leader_elect: bool = True
    lease_name: str = LEASE_NAME
    lease_duration: dt.timedelta = LEASE_DURATION
    renew_deadline: dt.timedelta = RENEW_DEADLINE
    retry_period: dt.timedelta = RETRY_PERIOD
    watch_namespace: str | None = None  # None: every namespace
    options: ReaperOptions = field(default_factory=ReaperOptions)


def add_flags(p: argparse.ArgumentParser) -> None:
    add_listen_flag(p, "0.0.0.0:8080", "HOST:PORT for /healthz, /metrics")
    p.add_argument("--kubeconfig", type=Path, default=None)
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", NAMESPACE))
    p.add_argument("--identity", default=os.environ.get("POD_NAME"))
    p.add_argument("--no-leader-elect", action="store_true", help="single replica only")
    p.add_argument("--lease-name", default=LEASE_NAME)
    p.add_argument("--lease-duration", default="15s")
    p.add_argument("--renew-deadline", default="10s")
    p.add_argument("--retry-period", default="2s")
    p.add_argument(
        "--watch-namespace",
        default=None,
        help="only reclaim sandboxes in this namespace (default: all)",
    )
    p.add_argument("--dry-run", action="store_true", help="Events, logs and metrics; no deletes")
    p.add_argument("--delete-qps", type=_positive(float), default=ReaperOptions.delete_qps)
    p.add_argument("--delete-burst", type=_positive(int), default=ReaperOptions.delete_burst)
    p.add_argument(
        "--workers",
        type=_positive(int),
        default=ReaperOptions.workers,
        help="reclaims in flight at once (default %(default)s); --delete-qps caps the rate",
    )
    p.add_argument("--stuck-pending", default="10m", help="Pending longer than this is stuck")
    p.add_argument("--stuck-failing", default="2m", help="pull errors / crash loops for this long")
    p.add_argument("--stuck-not-ready", default="15m", help="never Ready for this long")
    p.add_argument(
        "--keys-namespace",
        default=NAMESPACE,
        help="where Secret sandman-admission-key is (the webhook's namespace)",
    )
    p.add_argument("--webhook-config", default="sandman", help="ValidatingWebhookConfiguration")
    p.add_argument("--webhook-name", default="policy.sandman.dev", help="its lease webhook")
    p.add_argument(
        "--extension-grace",
        default="2m",
        help="hold leases that end during a webhook outage until it is back this long (0: off)",
    )


def _positive(kind: Callable[[str], float]) -> Callable[[str], Any]:
    """An argparse type: ``kind`` above zero (0 workers or a 0 rate reclaims nothing)."""

    def parse(value: str) -> Any:
        try:
            v = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {value}")
        return v

    return parse


def _d(value: str) -> dt.timedelta:
    return parse_duration(value)


def _grace(value: str) -> dt.timedelta:
    return dt.timedelta(0) if value.strip() in ("0", "off") else parse_duration(value)


def from_args(args: argparse.Namespace) -> ReaperConfig:
    host, port = args.listen
    return ReaperConfig(
        host=host,
        port=port,
        kubeconfig=args.kubeconfig,
        namespace=args.namespace,
        identity=args.identity or f"{socket.gethostname()}-{os.getpid()}",
        leader_elect=not args.no_leader_elect,
        lease_name=args.lease_name,
        lease_duration=_d(args.lease_duration),
        renew_deadline=_d(args.renew_deadline),
        retry_period=_d(args.retry_period),
        watch_namespace=args.watch_namespace,
        keys_namespace=args.keys_namespace,
        webhook_config=args.webhook_config,
        webhook_name=args.webhook_name,
        options=ReaperOptions(
            dry_run=args.dry_run,
            delete_qps=args.delete_qps,
            delete_burst=args.delete_burst,
            workers=args.workers,
            extension_grace=_grace(args.extension_grace),
            stuck=StuckLimits(
                pending=_d(args.stuck_pending),
                failing=_d(args.stuck_failing),
                not_ready=_d(args.stuck_not_ready),
            ),
        ),
    )
