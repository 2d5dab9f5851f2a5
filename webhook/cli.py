"""`sandman webhook serve` / `python -m sandman.webhook serve`."""

from __future__ import annotations

import argparse

from sandman.serving import component_main
from sandman.webhook import config as cfg


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("webhook", help="the admission webhook (daemon injection and policy)")
    wsub = p.add_subparsers(dest="webhook_cmd", required=True)
    s = wsub.add_parser("serve", help="serve /mutate and /validate over HTTPS")
    cfg.add_flags(s)
    s.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from sandman.webhook.server import serve

    return serve(cfg.from_args(args))


def main(argv: list[str] | None = None) -> int:
    return component_main("sandman-webhook", "webhook", add_parser, argv)
