"""`sandman reaper serve` / `python -m sandman.reaper serve`."""

from __future__ import annotations

import argparse

from sandman.reaper import config as cfg
from sandman.serving import component_main


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("reaper", help="reclaims sandboxes whose lease ended")
    rsub = p.add_subparsers(dest="reaper_cmd", required=True)
    s = rsub.add_parser("serve", help="run the controller (leader-elected)")
    cfg.add_flags(s)
    s.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from sandman.reaper.server import serve

    return serve(cfg.from_args(args))


def main(argv: list[str] | None = None) -> int:
    return component_main("sandman-reaper", "reaper", add_parser, argv)
