"""Entry point of `sandman` and `kubectl-sandman`."""

from __future__ import annotations

import argparse
import logging
import sys

from sandman import __version__
from sandman.cli import bench, cluster, demo, image, pools, sandboxes
from sandman.extender import cli as extender_cli
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
    sandboxes.add_parsers(sub)
    pools.add_parsers(sub)
    cluster.add_parser(sub)
    demo.add_parser(sub)
    image.add_parser(sub)
    webhook_cli.add_parser(sub)
    reaper_cli.add_parser(sub)
    extender_cli.add_parser(sub)
    bench.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `sandman run IMAGE -- CMD...` / `sandman exec POD -- CMD...`: what follows
    # `--` is the command, verbatim. Split it off here: argparse's own `--`
    # handling does not work across subcommands.
    tail: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    if tail:
        if not hasattr(args, "command"):
            parser.error("`--` is only for `run`, `exec` and `pool create`")
        args.command = tail
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        if getattr(args, "sandbox_cmd", None) is not None:
            return sandboxes.run_sandbox_command(args)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
