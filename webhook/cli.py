"""`sandman webhook serve` / `python -m sandman.webhook serve`."""

from __future__ import annotations

import argparse
import sys

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
    parser = argparse.ArgumentParser(prog="sandman-webhook")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_parser(sub)
    args = parser.parse_args(["webhook", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))
