"""`sandman webhook serve` / `python -m sandman.webhook serve`."""

from __future__ import annotations

import argparse

from sandman.clock import utc_now
from sandman.contract import NAMESPACE
from sandman.serving import component_main
from sandman.webhook import config as cfg


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("webhook", help="the admission webhook (daemon injection and policy)")
    wsub = p.add_subparsers(dest="webhook_cmd", required=True)
    s = wsub.add_parser("serve", help="serve /mutate and /validate over HTTPS")
    cfg.add_flags(s)
    s.set_defaults(func=_serve)
    r = wsub.add_parser(
        "rotate-key",
        help="start a new cluster key generation (docs/security.md: key rotation)",
        description="A new cluster key becomes current; the old one stays published for "
        "--overlap (sandboxes admitted under it keep working), then is retired: its "
        "namespace keys are withdrawn and the reaper reclaims sandboxes still under it.",
    )
    r.add_argument("--kubeconfig", default=None, help="default: in-cluster or $KUBECONFIG")
    r.add_argument("--namespace", default=NAMESPACE, help="where the cluster key Secret is")
    r.add_argument(
        "--overlap",
        default="24h",
        help="how long the old generation stays usable; at least the largest ttl.max of "
        "your policy, so no sandbox outlives its key (default 24h, the built-in ttl.max)",
    )
    r.add_argument(
        "--finish", action="store_true", help="end the running overlap now (retire the old key)"
    )
    r.set_defaults(func=_rotate)


def _serve(args: argparse.Namespace) -> int:
    from sandman.webhook.server import serve

    return serve(cfg.from_args(args))


def _rotate(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from sandman.contract import parse_duration
    from sandman.kube_async import KubeClient
    from sandman.tokens import RotationInProgress
    from sandman.webhook.access import rotate

    overlap = parse_duration(args.overlap, field="--overlap")

    async def go() -> int:
        kubeconfig = Path(args.kubeconfig) if args.kubeconfig else None
        async with KubeClient.from_kubeconfig(kubeconfig, user_agent="sandman-rotate-key") as c:
            try:
                ring = await rotate(
                    c,
                    args.namespace,
                    now=utc_now(),
                    overlap=overlap,
                    finish=args.finish,
                )
            except RotationInProgress as e:
                print(f"sandman: {e}")
                return 1
        if args.finish:
            print(f"cluster key generation {ring.current_id} is the only one now")
        else:
            print(
                f"cluster key generation {ring.current_id} is current; {ring.previous_id} "
                f"stays usable until {ring.previous_until:%Y-%m-%dT%H:%M:%SZ}"
            )
        return 0

    return asyncio.run(go())


def main(argv: list[str] | None = None) -> int:
    return component_main("sandman-webhook", "webhook", add_parser, argv)
