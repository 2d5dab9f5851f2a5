"""SDK behaviour against a mock transport (no cluster, no daemon)."""

from __future__ import annotations

import datetime as dt
import json
import ssl
from typing import Any

import pytest

from sandman.client import (
    ClientClosed,
    DaemonError,
    MockResponse,
    MockTransport,
    Sandbox,
    SandboxStartError,
    SandmanClient,
    Unauthorized,
    startup,
)
from sandman.client.transport import DaemonRequest, Target
from sandman.kube_async import Credentials, KubeClient
from sandman.tokens import namespace_key, sandbox_token

KEY = namespace_key(b"k" * 32, "ns", "ns-uid")
POD = {
    "metadata": {"name": "sb", "namespace": "ns", "uid": "u", "labels": {"sandman.dev/id": "abc"}},
    "status": {"podIP": "10.244.0.9"},
}


def client(handler: Any) -> SandmanClient:
    kube = KubeClient(Credentials("https://127.0.0.1:1", ssl.create_default_context()))
    return SandmanClient(
        kube=kube, namespace="ns", transport=MockTransport(handler), access_keys={"ns": KEY}
    )


async def test_exec_sends_the_derived_token_and_decodes_results() -> None:
    seen: list[tuple[Target, DaemonRequest]] = []

    async def handler(target: Target, req: DaemonRequest) -> MockResponse:
        seen.append((target, req))
        return MockResponse.json(
            200,
            {
                "exit_code": 3,
                "stdout": "/w8=",
                "stdout_encoding": "base64",
                "stderr": "err",
                "timed_out": False,
                "truncated": False,
                "duration_ms": 1.5,
            },
        )

    async with client(handler) as c:
        r = await Sandbox(c, POD).exec(["ls"], cwd="/w", timeout_s=5)
    assert (r.exit_code, r.stdout_bytes, r.stderr, r.ok) == (3, b"\xff\x0f", "err", False)
    target, req = seen[0]
    assert target.token == sandbox_token(KEY, "abc") and target.ip == "10.244.0.9"
    assert (req.method, req.path) == ("POST", "/v1/exec")
    assert req.json_body == {"cmd": ["ls"], "timeout_s": 5, "cwd": "/w"}


async def test_daemon_errors_are_typed() -> None:
    async def handler(target: Target, req: DaemonRequest) -> MockResponse:
        if req.path == "/v1/status":
            return MockResponse.json(401, {"error": {"code": "unauthorized", "message": "no"}})
        return MockResponse.json(404, {"error": {"code": "not_found", "message": "gone"}})

    async with client(handler) as c:
        sb = Sandbox(c, POD)
        with pytest.raises(Unauthorized):
            await sb.status()
        with pytest.raises(DaemonError) as e:
            await sb.read_file("/nope")
        assert (e.value.status, e.value.code) == (404, "not_found")


async def test_streamed_exec_yields_chunks_then_result() -> None:
    lines = [
        {"type": "output", "stream": "stdout", "data": "a", "encoding": "utf-8"},
        {"type": "output", "stream": "stderr", "data": "/w==", "encoding": "base64"},
        {
            "type": "result",
            "exit_code": 0,
            "timed_out": False,
            "truncated": False,
            "duration_ms": 2,
        },
    ]

    async def handler(target: Target, req: DaemonRequest) -> MockResponse:
        assert req.params == {"stream": "1"}
        return MockResponse(200, b"".join(json.dumps(x).encode() + b"\n" for x in lines))

    async with client(handler) as c:
        items = [x async for x in Sandbox(c, POD).exec_stream("true")]
    assert items[:2] == [("stdout", b"a"), ("stderr", b"\xff")]
    assert items[2].exit_code == 0


async def test_closed_client_says_so() -> None:
    async def handler(target: Target, req: DaemonRequest) -> MockResponse:
        return MockResponse.json(200, {})

    c = client(handler)
    with pytest.raises(ClientClosed):
        c.check_open()
    await c.open()
    await c.close()
    with pytest.raises(ClientClosed):
        await Sandbox(c, POD).status()
    with pytest.raises(ClientClosed):
        await c.open()


def _pod(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "status": status}


@pytest.mark.parametrize(
    ("status", "reason", "retryable"),
    [
        (
            {
                "containerStatuses": [
                    {
                        "name": "main",
                        "image": "r/x:1",
                        "state": {
                            "waiting": {
                                "reason": "ErrImagePull",
                                "message": 'failed to resolve reference "r/x:1": not found',
                            }
                        },
                    }
                ]
            },
            SandboxStartError.IMAGE_NOT_FOUND,
            False,
        ),
        (
            {
                "containerStatuses": [
                    {
                        "name": "main",
                        "state": {
                            "waiting": {
                                "reason": "ImagePullBackOff",
                                "message": "dial tcp: connection refused",
                            }
                        },
                    }
                ]
            },
            SandboxStartError.IMAGE_PULL,
            True,
        ),
        (
            {
                "containerStatuses": [
                    {"name": "main", "state": {"waiting": {"reason": "InvalidImageName"}}}
                ]
            },
            SandboxStartError.INVALID,
            False,
        ),
        ({"phase": "Failed", "reason": "DeadlineExceeded"}, SandboxStartError.CRASHED, False),
        (
            {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available",
                    }
                ]
            },
            SandboxStartError.UNSCHEDULABLE,
            True,
        ),
    ],
)
def test_start_failures_are_classified(
    status: dict[str, Any], reason: str, retryable: bool
) -> None:
    err = startup.verdict(
        _pod(**status),
        waited=dt.timedelta(seconds=60),
        unschedulable_grace=dt.timedelta(seconds=30),
    )
    assert err is not None and (err.reason, err.retryable) == (reason, retryable)


def test_unschedulable_within_grace_keeps_waiting() -> None:
    p = _pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}])
    assert (
        startup.verdict(
            p, waited=dt.timedelta(seconds=29), unschedulable_grace=dt.timedelta(seconds=30)
        )
        is None
    )


@pytest.mark.parametrize(
    ("status", "message", "reason", "retryable"),
    [
        (
            403,
            'admission webhook "policy.sandman.dev" denied the request: [registry]',
            SandboxStartError.POLICY_DENIED,
            False,
        ),
        (
            403,
            'pods "x" is forbidden: exceeded quota: q, requested: pods=1',
            SandboxStartError.QUOTA,
            True,
        ),
        (
            500,
            'Internal error occurred: failed calling webhook "inject.sandman.dev"',
            SandboxStartError.ADMISSION_UNAVAILABLE,
            True,
        ),
        (422, "Pod is invalid", SandboxStartError.INVALID, False),
        (
            403,
            'pods is forbidden: User "alice" cannot create resource "pods" in API group ""'
            ' in the namespace "team-b"',
            SandboxStartError.FORBIDDEN,
            False,
        ),
    ],
)
def test_admission_errors_are_classified(
    status: int, message: str, reason: str, retryable: bool
) -> None:
    err = startup.admission_error(status, {"message": message})
    assert (err.reason, err.retryable, err.message) == (reason, retryable, message)
