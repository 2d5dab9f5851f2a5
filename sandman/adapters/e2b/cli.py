"""`sandman e2b-gateway`: serve E2B's API over Sandman sandboxes (docs/adapters.md)."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from pathlib import Path

from sandman.adapters.e2b.gateway import MAX_UPLOAD_BYTES, GatewayConfig, run_gateway
from sandman.cli import durations
from sandman.cli.common import CliError, UsageError
from sandman.kube_async import load_credentials
from sandman.serving import add_listen_flag

KEY_ENV = "SANDMAN_E2B_API_KEY"
# 49982: next to envd's 49983, and free on a machine that runs no E2B.
DEFAULT_LISTEN = "127.0.0.1:49982"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "e2b-gateway",
        help="serve E2B's API over Sandman sandboxes (point E2B's SDK at it)",
        description="An E2B-compatible endpoint: E2B's own SDK, given E2B_API_URL, "
        "E2B_SANDBOX_URL and E2B_API_KEY, creates and drives Sandman sandboxes "
        "(template = image, set_timeout = lease, kill = release).",
    )
    add_listen_flag(
        p, DEFAULT_LISTEN, "where to listen (keep it on loopback; port 0: any free port)"
    )
    p.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG, ~/.kube/config")
    p.add_argument("--context", default=None, help="kubeconfig context (default: its current)")
    p.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="where sandboxes are made (default: the context's namespace, as kubectl)",
    )
    p.add_argument("--transport", choices=("auto", "direct", "proxy"), default="auto")
    p.add_argument(
        "--template",
        action="append",
        default=[],
        metavar="NAME=IMAGE",
        help="map an E2B template id to an image (repeatable); a template id "
        "containing '/' is used as the image itself",
    )
    p.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        help=f"the key clients must send as E2B_API_KEY (default: ${KEY_ENV}, "
        "else a random key printed at start)",
    )
    p.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--startup-timeout", type=durations.seconds, default=300.0, help="e.g. 90, 5m (300s)"
    )
    p.add_argument(
        "--max-upload-bytes",
        type=int,
        default=MAX_UPLOAD_BYTES,
        metavar="N",
        help="the largest file one POST /files may upload (held in the gateway's "
        "memory while it goes to the sandbox; default 512 MiB)",
    )
    p.set_defaults(func=cmd_gateway)


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key or not value:
            raise UsageError(f"e2b-gateway: {flag} wants KEY=VALUE, got {v!r}")
        out[key] = value
    return out


def _api_key(path: Path | None) -> tuple[str, bool]:
    """(key, generated)."""
    if path is not None:
        key = path.read_text().strip()
        if not key:
            raise CliError(f"e2b-gateway: {path} is empty")
        return key, False
    if os.environ.get(KEY_ENV):
        return os.environ[KEY_ENV], False
    return "sandman_" + secrets.token_urlsafe(24), True


def gateway_url(host: str, port: int) -> str:
    """The URL clients use for a bound (host, port).

    >>> gateway_url("127.0.0.1", 49982), gateway_url("::1", 8080)
    ('http://127.0.0.1:49982', 'http://[::1]:8080')
    """
    return f"http://{host if ':' not in host else f'[{host}]'}:{port}"


def cmd_gateway(args: argparse.Namespace) -> int:
    host, port = args.listen
    key, generated = _api_key(args.api_key_file)
    # The context's namespace when -n is not given, as kubectl (and every other
    # command here) does; "default" only where the context names none.
    namespace = args.namespace or load_credentials(args.kubeconfig, args.context).namespace
    config = GatewayConfig(
        namespace=namespace,
        api_key=key,
        templates=_pairs(args.template, "--template"),
        node_selector=_pairs(args.node_selector, "--node-selector") or None,
        startup_timeout_s=args.startup_timeout,
        max_upload_bytes=args.max_upload_bytes,
    )

    def listening(addresses: list[tuple[str, int]]) -> None:
        # The port really bound (with --listen HOST:0 the kernel's pick), once bound.
        bound_host, bound_port = addresses[0] if addresses else (host, port)
        url = gateway_url(bound_host, bound_port)
        print(f"serving E2B's API for namespace {namespace} on {url}", file=sys.stderr)
        print(f"export E2B_API_URL={url} E2B_SANDBOX_URL={url}", file=sys.stderr)
        if generated:
            print(f"export E2B_API_KEY={key}", file=sys.stderr)
        sys.stderr.flush()

    return asyncio.run(
        run_gateway(
            config, host=host, port=port, kubeconfig=args.kubeconfig, context=args.context,
            transport=args.transport, on_listening=listening,
        )
    )  # fmt: skip
