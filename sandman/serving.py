"""Running a component's aiohttp app: the plumbing every server shares, written once.

Each component (webhook, reaper, extender) builds its own app with a factory
and hands it here to be served until SIGTERM/SIGINT, with graceful cleanup
(the app's cleanup_ctx runs, background tasks are cancelled and awaited).
Their ``--listen`` flag is parsed here too.

prometheus-client comes with ``[server]``; it is imported where a metrics
response is built, so that a component's CLI (flags, ``sandman extender
where``) also runs on a core install.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sandman.logs import setup_json_logging

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

Background = Callable[[], Coroutine[Any, Any, None]]

# Idle keep-alive connections are closed by the client, not by us: our
# callers (the apiserver, kube-scheduler, Prometheus) are Go clients whose
# idle timeout is 90 s (Go's default transport). A server that closes an idle
# connection first (aiohttp's default: 75 s) races a request the client is
# writing on it at that moment, which then fails with EOF (a POST is not
# retried): an admission refused for no reason.
KEEPALIVE_S = 120.0


async def serve_app(
    app: web.Application,
    *,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    on_stop: Callable[[], None] | None = None,
    background: Sequence[Background] = (),
    drain_s: float = 0.0,
    stop: asyncio.Event | None = None,
    on_listening: Callable[[list[tuple[str, int]]], None] | None = None,
) -> int:
    """Serve ``app`` until SIGTERM or SIGINT (or ``stop`` is set); returns
    the exit code (0).

    ``on_listening`` hears the (host, port) pairs really bound once the site
    listens: with port 0 the kernel picks the port, and only this knows it.

    ``background`` coroutines are process-level work (not the app's, which
    belongs in its cleanup_ctx): each starts once the site listens, so the
    app's cleanup_ctx has run its startup half, and is cancelled and awaited
    at the stop signal, before ``on_stop`` and the app's cleanup.

    ``drain_s``: after the stop signal, keep serving that long, answering
    every request with ``Connection: close``. A client's pooled keep-alive
    connections to this process outlive its removal from the Service's
    endpoints; closing them while idle races a request being written on one
    (an admission failing with EOF during an upgrade, seen in CI). Closed
    after a response, they are never reused; only connections that stay idle
    through the whole drain are closed under the client.
    """
    draining = False

    async def close_when_draining(_request: web.Request, response: web.StreamResponse) -> None:
        if draining:
            response.force_close()  # we close after the response...
            response.headers["Connection"] = "close"  # ...and the client knows

    if drain_s > 0:
        app.on_response_prepare.append(close_when_draining)
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, keepalive_timeout=KEEPALIVE_S
    )
    await runner.setup()
    # backlog 1024: a burst of pod creates opens many connections at once.
    site = web.TCPSite(
        runner, host, port, ssl_context=ssl_context, reuse_address=True, backlog=1024
    )
    await site.start()
    if on_listening is not None:
        on_listening([(str(a[0]), int(a[1])) for a in runner.addresses])
    tasks = [asyncio.ensure_future(fn()) for fn in background]
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    if drain_s > 0:
        draining = True
        await asyncio.sleep(drain_s)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if on_stop is not None:
        on_stop()
    await runner.cleanup()
    return 0


def metrics_response(registry: CollectorRegistry) -> web.Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


def parse_listen(value: str, default_host: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); an empty host is
    ``default_host``. Raises ArgumentTypeError, which argparse shows as a
    usage error naming the flag."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"wants HOST:PORT, got {value!r}")
    return host.strip("[]") or default_host, int(port)


def add_listen_flag(p: argparse.ArgumentParser, default: str, help: str) -> None:
    """``--listen HOST:PORT``, parsed into ``args.listen = (host, port)``."""
    default_host = default.rpartition(":")[0]

    def listen(value: str) -> tuple[str, int]:
        return parse_listen(value, default_host)

    p.add_argument("--listen", type=listen, default=default, metavar="HOST:PORT", help=help)


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
