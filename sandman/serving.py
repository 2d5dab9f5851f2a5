"""Running a component's aiohttp app: the plumbing every server shares, written once.

Each component (webhook, reaper, extender) builds its own app with a factory
and hands it here to be served until SIGTERM/SIGINT, with graceful cleanup
(the app's cleanup_ctx runs, background tasks are cancelled and awaited).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
import sys
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sandman.logs import setup_json_logging


async def serve_app(
    app: web.Application,
    *,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    on_stop: Callable[[], None] | None = None,
) -> int:
    """Serve ``app`` until SIGTERM or SIGINT; returns the exit code (0)."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    # backlog 1024: a burst of pod creates opens many connections at once.
    site = web.TCPSite(
        runner, host, port, ssl_context=ssl_context, reuse_address=True, backlog=1024
    )
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if on_stop is not None:
        on_stop()
    await runner.cleanup()
    return 0


def metrics_response(registry: CollectorRegistry) -> web.Response:
    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


def run_main(coro_fn: Callable[[], object]) -> int:
    """The process entry: JSON logs, one event loop, the coroutine's exit code."""
    setup_json_logging()
    return int(asyncio.run(coro_fn()))  # type: ignore[arg-type]


def component_main(
    prog: str,
    name: str,
    add_parser: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None],
    argv: list[str] | None = None,
) -> int:
    """`python -m sandman.<name> ...` == `sandman <name> ...`."""
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_parser(sub)
    args = parser.parse_args([name, *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))
