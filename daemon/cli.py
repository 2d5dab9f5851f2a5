"""`sandmand`: the in-sandbox daemon's command line.

sandmand serve --listen HOST:PORT [--workspace DIR] [-- ORIGINAL COMMAND...]
sandmand install DIR [--shared NODE_DIR]   # place the runtime tree (init container)
sandmand version

Only the standard library modules serving needs are imported up front;
install, reset, tar and status import theirs when they run.
"""

from __future__ import annotations

import argparse
import sys

from sandman.daemon import __version__
from sandman.daemon.config import DAEMON_DIR, DEFAULT_PORT, from_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sandmand", description="Sandman in-sandbox daemon")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="serve the sandbox API (normally as PID 1)")
    s.add_argument("--listen", default=f"0.0.0.0:{DEFAULT_PORT}", help="HOST:PORT")
    s.add_argument("--token-sha256", default=None, help="hex SHA-256 of the bearer token")
    s.add_argument("--token-sha256-file", default=None, help="file holding that hash")
    s.add_argument("--daemon-dir", default=DAEMON_DIR, help="the daemon's own (protected) dir")
    s.add_argument("--allow-root", action="append", help="path the file API may use (repeat)")
    s.add_argument("--workspace", default=None, help="git checkout restored by /v1/reset")
    s.add_argument(
        "--manifest", action="append", help="file or dir reset verifies by content (repeat)"
    )
    s.add_argument(
        "--python-dirs",
        default="auto",
        metavar="auto|none|DIR[:DIR...]",
        help="Python trees reset verifies (default: the image's lib/python3* dirs)",
    )
    s.add_argument(
        "--temp-dir", action="append", help="dir reset empties (repeat; default /tmp, /var/tmp)"
    )
    s.add_argument("--grace", type=float, default=5.0, help="seconds from SIGTERM to SIGKILL")
    s.add_argument(
        "--exit-with-command",
        action="store_true",
        help="when the original command exits, answer requests in flight and exit with its code",
    )
    s.add_argument("--no-reset", action="store_true", help="refuse /v1/reset (eval profile)")
    s.add_argument(
        "--readiness-probe",
        default=None,
        metavar="JSON",
        help="the container's own readinessProbe (Kubernetes Probe JSON); GET /readyz checks it",
    )
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- original command and args")
    i = sub.add_parser("install", help="place the daemon's runtime tree in DIR (init container)")
    i.add_argument("dir")
    i.add_argument(
        "--shared",
        metavar="NODE_DIR",
        default=None,
        help="install once into NODE_DIR (a node directory shared by pods); DIR/rt links to it",
    )
    i.add_argument(
        "--release-image",
        metavar="IMAGE",
        default=None,
        help="also name the tree NODE_DIR/release/<hash of IMAGE>, the daemon image reference the"
        " webhook injects (the node installer of the node delivery)",
    )
    sub.add_parser("idle", help="wait for SIGTERM (the node installer's pod, after its install)")
    sub.add_parser("version")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "version":
        print(__version__)
        return 0
    if args.cmd == "install":
        from sandman.contract import daemon_release
        from sandman.daemon.install import install

        try:
            release = daemon_release(args.release_image) if args.release_image else None
            where, copied = install(args.dir, args.shared, release)
        except (OSError, ValueError) as e:
            print(f"sandmand install: {e}", file=sys.stderr)
            return 1
        print(f"{where} ({'installed' if copied else 'already there'})")
        return 0
    if args.cmd == "idle":
        return _idle()
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    try:
        config = from_args(args)
    except ValueError as e:
        print(f"sandmand: {e}", file=sys.stderr)
        return 2
    from sandman.daemon.server import serve

    return serve(config)


def _idle() -> int:
    """Block until SIGTERM or SIGINT (as PID 1 nothing else ends it)."""
    import signal

    def stop(_sig: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        signal.pause()
