"""The shared server plumbing: --listen parsing for every component."""

from __future__ import annotations

import argparse
import asyncio
import socket
from types import ModuleType
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from sandman.extender import config as extender_config
from sandman.reaper import config as reaper_config
from sandman.serving import add_listen_flag, parse_listen, serve_app
from sandman.webhook import config as webhook_config


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("127.0.0.1:8443", ("127.0.0.1", 8443)),
        (":8080", ("0.0.0.0", 8080)),  # empty host: the default's
        ("[::1]:7000", ("::1", 7000)),
        ("localhost:0", ("localhost", 0)),  # port 0: any free port
    ],
)
def test_parse_listen(value: str, want: tuple[str, int]) -> None:
    assert parse_listen(value, "0.0.0.0") == want


@pytest.mark.parametrize("value", ["8080", "host:", "host:http", "host:65536", "host:-1"])
def test_bad_listen_is_a_usage_error_naming_the_flag(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    p = argparse.ArgumentParser()
    add_listen_flag(p, "127.0.0.1:1", "HOST:PORT")
    with pytest.raises(SystemExit) as e:
        p.parse_args([f"--listen={value}"])
    assert e.value.code == 2
    assert f"--listen: wants HOST:PORT, got {value!r}" in capsys.readouterr().err


def _config(module: ModuleType, argv: list[str]) -> Any:
    p = argparse.ArgumentParser()
    module.add_flags(p)
    return module.from_args(p.parse_args(argv))


@pytest.mark.parametrize(
    ("module", "extra", "default"),
    [
        (webhook_config, ["--daemon-image=127.0.0.1:5000/d:1"], ("0.0.0.0", 8443)),
        (reaper_config, [], ("0.0.0.0", 8080)),
        (extender_config, [], ("127.0.0.1", 8890)),
    ],
)
def test_each_component_takes_listen_the_same_way(
    module: ModuleType, extra: list[str], default: tuple[str, int]
) -> None:
    c = _config(module, extra)
    assert (c.host, c.port) == default
    c = _config(module, [*extra, "--listen=:9999"])
    assert (c.host, c.port) == (default[0], 9999)
    c = _config(module, [*extra, "--listen=10.0.0.1:1234"])
    assert (c.host, c.port) == ("10.0.0.1", 1234)


async def test_after_the_stop_signal_requests_are_answered_and_close_their_connection() -> None:
    """The drain: keep-alive before the stop; after it, still answered, each
    response closing its connection (so a client never reuses one we close)."""

    async def ok(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    stop = asyncio.Event()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = asyncio.create_task(
        serve_app(app, host="127.0.0.1", port=port, drain_s=1.0, stop=stop)
    )
    url = f"http://127.0.0.1:{port}/"
    async with aiohttp.ClientSession() as http:
        for _ in range(100):  # until the site listens
            try:
                async with http.get(url) as r:
                    assert r.status == 200 and "close" not in r.headers.get("Connection", "")
                break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.02)
        stop.set()
        await asyncio.sleep(0.1)
        async with http.get(url) as r:  # in the drain: answered, and told to close
            assert r.status == 200 and r.headers["Connection"] == "close"
    assert await asyncio.wait_for(server, 10) == 0  # then it stops on its own
