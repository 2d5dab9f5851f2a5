"""Entry point of `sandman` and `kubectl-sandman`."""

from __future__ import annotations

import argparse
import logging
import sys

from sandman import __version__
from sandman.cli import bench, cluster, image
from sandman.reaper import cli as reaper_cli
from sandman.webhook import cli as webhook_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandman",
        description="Kubernetes-native sandboxes for agentic RL: clients just create labeled pods.",
    )
    parser.add_argument("--version", action="version", version=f"sandman {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="cmd", required=True)
    cluster.add_parser(sub)
    image.add_parser(sub)
    webhook_cli.add_parser(sub)
    reaper_cli.add_parser(sub)
    bench.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
