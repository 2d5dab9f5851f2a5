"""The async client honours the apiserver's push-back (429, 5xx + Retry-After).

A real HTTP server stands in for the apiserver and answers a scripted list
of statuses; the client's sleep is injected, so the waits it chose are
recorded instead of slept.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from sandman.kube_async import (
    PODS,
    RETRY_AFTER_MAX_S,
    ApiError,
    Credentials,
    KubeClient,
    retry_after,
)


@dataclass
class Script:
    """Answers to give, in order: (status, Retry-After header or None); then 201."""

    answers: list[tuple[int, str | None]] = field(default_factory=list)
    bodies: list[Any] = field(default_factory=list)
    url: str = ""


@pytest.fixture
async def server() -> AsyncIterator[Script]:
    script = Script()

    async def create(request: web.Request) -> web.Response:
        script.bodies.append(await request.json())
        if script.answers:
            status, after = script.answers.pop(0)
            headers = {"Retry-After": after} if after is not None else {}
            doc = {"kind": "Status", "code": status, "reason": "TooManyRequests"}
            return web.json_response(doc, status=status, headers=headers)
        return web.json_response({"metadata": {"name": "p", "uid": "u1"}}, status=201)

    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{ns}/pods", create)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    script.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield script
    finally:
        await runner.cleanup()


def client(url: str, slept: list[float], budget: float = 120.0) -> KubeClient:
    async def sleep(s: float) -> None:
        slept.append(s)

    creds = Credentials(url, ssl.create_default_context())
    return KubeClient(creds, sleep=sleep, throttle_budget_s=budget)


async def test_a_create_refused_with_429_is_sent_again_after_retry_after(server: Script) -> None:
    server.answers = [(429, "2"), (429, "1")]
    slept: list[float] = []
    async with client(server.url, slept) as kube:
        got = await kube.create(PODS, {"metadata": {"name": "p"}}, "ns")
    assert got["metadata"]["uid"] == "u1"
    # Three sends of the same body; the waits are the ones the server asked for.
    assert server.bodies == [{"metadata": {"name": "p"}}] * 3
    assert slept == [2.0, 1.0]
    assert kube.throttled[429] == 2 and kube.throttled_wait_s == 3.0


async def test_a_5xx_is_retried_only_when_it_carries_retry_after(server: Script) -> None:
    server.answers = [(503, "1"), (500, None)]
    slept: list[float] = []
    async with client(server.url, slept) as kube:
        with pytest.raises(ApiError) as e:
            await kube.create(PODS, {"metadata": {"name": "p"}}, "ns")
    # The 503 said "not processed, come back": sent again; the plain 500 may
    # have been processed (a create could exist): surfaced, not repeated.
    assert e.value.status == 500
    assert len(server.bodies) == 2 and slept == [1.0]


async def test_waiting_stops_at_the_budget_with_the_apiservers_error(server: Script) -> None:
    server.answers = [(429, "1")] * 10
    slept: list[float] = []
    async with client(server.url, slept, budget=3.0) as kube:
        with pytest.raises(ApiError) as e:
            await kube.create(PODS, {"metadata": {"name": "p"}}, "ns")
    # 1 s + 1 s + 1 s fit the 3 s budget; the fourth 429 would exceed it.
    assert e.value.status == 429 and slept == [1.0, 1.0, 1.0]
    assert len(server.bodies) == 4


@pytest.mark.parametrize(
    ("status", "header", "want"),
    [
        (429, "3", 3.0),  # as asked
        (429, None, 1.0),  # APF always sends one; a bare 429 waits the default
        (429, "soon", 1.0),  # an unreadable value: the default
        (429, "0", 0.1),  # never a busy loop
        (429, "3600", RETRY_AFTER_MAX_S),  # capped
        (503, "2", 2.0),  # 5xx with the header: not processed
        (503, None, None),  # 5xx without: maybe processed, never repeated
        (500, "-1", None),
        (409, "1", None),  # other 4xx: a real answer
        (200, None, None),
    ],
)
def test_retry_after_follows_client_go(status: int, header: str | None, want: float | None) -> None:
    assert retry_after(status, header) == want
