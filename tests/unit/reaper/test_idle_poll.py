"""The reaper's idle poll reads what a sandbox's daemon answers: hostile input.

An agent that replaced the daemon's files (its emptyDir is writable in the
copy delivery) controls what ``GET /v1/idle`` answers after a restart. The
reaper must neither hold a huge answer in memory nor fail on a number it
cannot turn into an instant; any such answer counts as no answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from sandman.reaper.idle import IDLE_UNSUPPORTED, MAX_IDLE_BODY, poll_idle_seconds


async def _serve(handler: web.Handler) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_get("/v1/idle", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


POD = {"status": {"podIP": "127.0.0.1"}}


@pytest.mark.parametrize(
    ("body", "want"),
    [
        (b'{"idle_s": 12}', 12.0),
        (b'{"idle_s": 0}', 0.0),
        (b'{"idle_s": Infinity}', None),  # json.loads accepts it; timedelta does not
        (b'{"idle_s": NaN}', None),
        (b'{"idle_s": 1e300}', None),  # past any lease: an instant no clock can hold
        (b'{"idle_s": -1}', None),
        (b'{"idle_s": "12"}', 12.0),
        (b'{"idle_s": [1]}', None),
        (b"[1]", None),
        (b"not json", None),
        # Nested past the JSON parser's recursion limit (RecursionError, not a
        # ValueError) inside the 4 KiB the reaper reads: no answer, no crash.
        (b"[" * 4000, None),
        (b'{"idle_s": ' + b"[" * 4000, None),
    ],
)
async def test_answers_that_are_not_an_idle_figure_count_as_no_answer(
    http: aiohttp.ClientSession, body: bytes, want: float | None
) -> None:
    async def handler(_r: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    runner, port = await _serve(handler)
    try:
        assert await poll_idle_seconds(http, POD, port=port) == want
    finally:
        await runner.cleanup()


async def test_a_huge_answer_is_not_read_whole(http: aiohttp.ClientSession) -> None:
    sent = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"idle_s": 1, "pad": "')
        try:
            for _ in range(4096):  # 256 MiB if the reaper read it all
                await resp.write(b"x" * 65536)
                sent += 65536
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass
        return resp

    runner, port = await _serve(handler)
    try:
        assert await poll_idle_seconds(http, POD, port=port) is None
        assert sent < 64 * MAX_IDLE_BODY + (16 << 20)  # the reaper hung up early
    finally:
        await runner.cleanup()


async def test_an_old_daemon_without_the_endpoint_is_unsupported(
    http: aiohttp.ClientSession,
) -> None:
    app = web.Application()
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        assert await poll_idle_seconds(http, POD, port=port) == IDLE_UNSUPPORTED
    finally:
        await runner.cleanup()
