"""The Connect protocol as served over aiohttp: errors travel on exactly one channel
(HTTP status for unary calls, the end-of-stream envelope for streams)."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sandman.adapters.e2b.connect import Call, ConnectError, envelope, routes


async def echo(call: Call, msg: dict[str, Any]) -> dict[str, Any]:
    if msg.get("fail"):
        raise ConnectError("not_found", "no such thing")
    return {"echo": msg, "timeout_ms": call.timeout_ms}


async def count(call: Call, msg: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    for i in range(int(msg["n"])):
        yield {"i": i}
    if msg.get("fail"):
        raise ConnectError("unavailable", "went away")


def frames(body: bytes) -> list[tuple[int, dict]]:
    out, pos = [], 0
    while pos < len(body):
        flags, length = struct.unpack(">BI", body[pos : pos + 5])
        out.append((flags, json.loads(body[pos + 5 : pos + 5 + length])))
        pos += 5 + length
    return out


async def client() -> TestClient:
    app = web.Application()
    app.add_routes(routes("t.Svc", {"Echo": echo}, {"Count": count}, unimplemented=("Watch",)))
    c = TestClient(TestServer(app))
    await c.start_server()
    return c


async def test_unary_calls_and_their_errors() -> None:
    c = await client()
    try:
        json_h = {"Content-Type": "application/json", "connect-timeout-ms": "1500"}
        r = await c.post("/t.Svc/Echo", data=b'{"a": 1}', headers=json_h)
        assert r.status == 200 and await r.json() == {"echo": {"a": 1}, "timeout_ms": 1500}
        r = await c.post("/t.Svc/Echo", data=b'{"fail": true}', headers=json_h)
        assert r.status == 404
        assert await r.json() == {"code": "not_found", "message": "no such thing"}
        r = await c.post("/t.Svc/Echo", data=b"x", headers={"Content-Type": "application/proto"})
        assert r.status == 501 and (await r.json())["code"] == "unimplemented"
        r = await c.post("/t.Svc/Watch", data=b"{}", headers=json_h)
        assert r.status == 501
    finally:
        await c.close()


async def test_streams_end_with_an_envelope_that_carries_any_error() -> None:
    c = await client()
    try:
        h = {"Content-Type": "application/connect+json"}
        r = await c.post("/t.Svc/Count", data=envelope({"n": 2}), headers=h)
        assert r.status == 200 and r.headers["Content-Type"] == "application/connect+json"
        assert frames(await r.read()) == [(0, {"i": 0}), (0, {"i": 1}), (2, {})]
        r = await c.post("/t.Svc/Count", data=envelope({"n": 1, "fail": True}), headers=h)
        error = {"code": "unavailable", "message": "went away"}
        assert frames(await r.read()) == [(0, {"i": 0}), (2, {"error": error})]
        r = await c.post("/t.Svc/Count", data=b"\x00\x00", headers=h)  # a torn envelope
        assert (
            r.status == 200 and frames(await r.read())[0][1]["error"]["code"] == "invalid_argument"
        )
    finally:
        await c.close()
