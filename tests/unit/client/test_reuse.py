"""A sandbox whose container restarted is never reused: the rule, and every reuse path.

The rule is pure (``sandman.client.reuse``). The paths that reuse a
sandbox (the fleet after a rollout, the gym adapter's reset, a pool claim)
are driven against a real HTTP server standing in for the apiserver (pods
by name: GET, PATCH answered with the stored pod, DELETE recorded) and a
mock daemon whose ``/v1/reset`` answers ``clean: true``, so only the pod's
``restartCount`` can refuse the reuse.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import random
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from sandman.client import MockResponse, MockTransport, Sandbox, SandmanClient, reuse
from sandman.client.transport import DaemonRequest, Target
from sandman.contract import LABEL_POOL, LABEL_SANDBOX, LABEL_STATE
from sandman.fleet.fleet import Fleet, FleetConfig
from sandman.fleet.records import RunData
from sandman.fleet.reuse import ProblemState
from sandman.fleet.spans import SpanBook
from sandman.kube_async import Credentials, KubeClient
from sandman.pools.claim import claim, rank
from sandman.pools.health import pool_health
from sandman.pools.spec import STATE_IDLE
from sandman.tokens import namespace_key

KEY = namespace_key(b"k" * 32, "ns", "ns-uid")


def pod(name: str = "sb", *, restarts: int = 0, ready: bool = True, init_restarts: int = 0):
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": {
                "sandman.dev/id": name,
                LABEL_SANDBOX: "true",
                LABEL_POOL: "p",
                LABEL_STATE: STATE_IDLE,
            },
            "creationTimestamp": "2026-11-30T11:00:00Z",
        },
        "spec": {},
        "status": {
            "phase": "Running",
            "podIP": "10.244.0.9",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "initContainerStatuses": [{"name": "sandman-install", "restartCount": init_restarts}],
            "containerStatuses": [
                {"name": "main", "restartCount": restarts, "state": {"running": {}}}
            ],
        },
    }


# -- the rule ---------------------------------------------------------------------------
def test_clean_and_never_restarted_is_reusable() -> None:
    assert reuse.refusal({"clean": True}, pod()) is None


def test_a_restarted_container_voids_a_clean_reset() -> None:
    why = reuse.refusal({"clean": True}, pod(restarts=1))
    assert why is not None and "main x1" in why and "restarted" in why


def test_drift_is_refused_with_its_first_lines() -> None:
    why = reuse.refusal({"clean": False, "drift": ["a", "b", "c", "d"]}, pod())
    assert why == "reset found drift: a; b; c"
    assert reuse.refusal({}, pod()) == "reset found drift"  # no verdict is no clean verdict


def test_init_container_restarts_do_not_count() -> None:
    # The install step runs before the daemon's first start: no record yet.
    assert reuse.restarts(pod(init_restarts=3)) == {}
    assert reuse.refusal({"clean": True}, pod(init_restarts=3)) is None


def test_a_pod_without_statuses_has_no_restarts() -> None:
    assert reuse.restarts({"metadata": {}}) == {}


def test_pools_never_rank_a_restarted_pod_and_count_it_apart() -> None:
    pods = [pod("ok"), pod("restarted", restarts=2), pod("starting", ready=False, restarts=1)]
    assert [p["metadata"]["name"] for p in rank(pods, random.Random(0))] == ["ok"]
    h = pool_health(pods)
    assert (h.ready, h.starting, h.restarted) == (1, 0, 2)


# -- a stand-in apiserver -------------------------------------------------------------
@dataclass
class Api:
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    url: str = ""


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    state = Api()

    async def get(request: web.Request) -> web.Response:
        p = state.pods.get(request.match_info["name"])
        if p is None:
            gone = {"kind": "Status", "code": 404, "reason": "NotFound"}
            return web.json_response(gone, status=404)
        return web.json_response(p)

    async def delete(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        state.deleted.append(name)
        return web.json_response(state.pods.pop(name, {"metadata": {"name": name}}))

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/pods/{name}", get)
    app.router.add_patch("/api/v1/namespaces/ns/pods/{name}", get)  # the claim "wins"
    app.router.add_delete("/api/v1/namespaces/ns/pods/{name}", delete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield state
    finally:
        await runner.cleanup()


def client(api: Api, resets: list[str]) -> SandmanClient:
    async def daemon(target: Target, req: DaemonRequest) -> MockResponse:
        assert req.path == "/v1/reset"
        resets.append(target.ip or "")
        return MockResponse.json(200, {"clean": True, "drift": [], "actions": []})

    kube = KubeClient(Credentials(api.url, ssl.create_default_context()))
    return SandmanClient(
        kube=kube, namespace="ns", transport=MockTransport(daemon), access_keys={"ns": KEY}
    )


@pytest.mark.parametrize("restarts", [0, 1])
async def test_the_sdk_reads_the_pod_after_the_reset(api: Api, restarts: int) -> None:
    resets: list[str] = []
    async with client(api, resets) as c:
        sb = Sandbox(c, pod())  # the handle's pod is from before: never restarted
        api.pods["sb"] = pod(restarts=restarts)  # the live pod
        report = await sb.reset()
        why = await sb.reuse_refusal(report)
    assert report["clean"] is True and resets
    assert (why is None) == (restarts == 0)


async def test_a_pod_gone_or_replaced_is_refused(api: Api) -> None:
    async with client(api, []) as c:
        sb = Sandbox(c, pod())
        assert await sb.reuse_refusal({"clean": True}) == "the pod is gone"
        other = pod()
        other["metadata"]["uid"] = "a-new-pod"
        api.pods["sb"] = other
        assert "another pod" in (await sb.reuse_refusal({"clean": True}) or "")
        assert sb.pod["metadata"]["uid"] == "uid-sb"  # never adopts someone else's pod


@pytest.mark.parametrize("restarts", [0, 1])
async def test_the_fleet_replaces_a_restarted_sandbox_after_its_reset(
    api: Api, restarts: int
) -> None:
    resets: list[str] = []
    async with client(api, resets) as c:
        fleet = Fleet(c, FleetConfig(reuse=True, k=1, max_reuses=8))
        # What Fleet.run sets up before dispatching (the parts _after touches).
        fleet.data = RunData("none", True, 1, 4, 1)
        fleet.spans = SpanBook(0.0)
        fleet.changed, fleet.replan = asyncio.Event(), asyncio.Event()
        s = ProblemState(0, rollouts=4, undispatched=2, unserved=2, live=1)
        sb = Sandbox(c, pod())
        api.pods["sb"] = pod(restarts=restarts)
        await fleet._after(s, sb)
    assert resets, "the reset ran first"
    if restarts:
        assert s.idle == [] and api.deleted == ["sb"] and s.live == 0
        assert fleet.data.counters.resets_dirty == 1
    else:
        assert s.idle == [sb] and api.deleted == []
        assert fleet.data.counters.resets_dirty == 0


@pytest.mark.parametrize("restarts", [0, 1])
async def test_the_gym_env_gets_a_new_sandbox_for_a_restarted_one(api: Api, restarts: int) -> None:
    pytest.importorskip("gymnasium")
    from sandman.adapters.gym import SandmanEnv
    from sandman.adapters.gymtask import Task

    resets: list[str] = []
    async with client(api, resets) as c:

        class Connection:  # the env's LoopClient, on this test's loop
            client = c

        env = SandmanEnv("127.0.0.1:5000/t:1", Task("t", "do it"), namespace="ns",
                         connection=Connection())  # type: ignore[arg-type]  # fmt: skip
        fresh = Sandbox(c, pod("fresh"))

        async def acquire() -> Sandbox:
            return fresh

        env._acquire = acquire  # type: ignore[method-assign]
        old = Sandbox(c, pod())
        env.sandbox = old
        api.pods["sb"] = pod(restarts=restarts)
        got = await env._pristine()
    assert resets
    if restarts:
        assert got is fresh and api.deleted == ["sb"]
    else:
        assert got is old and api.deleted == []


async def test_a_claim_discards_a_pod_that_restarted_after_the_list(api: Api) -> None:
    listed = [pod("a"), pod("b")]  # both looked fine when listed
    api.pods["a"] = pod("a", restarts=1)
    api.pods["b"] = pod("b")
    async with client(api, []) as c:
        res = await claim(
            c.kube, "ns", "p", claimer="me", ttl=dt.timedelta(minutes=5),
            candidates=copy.deepcopy(listed), rng=_FirstA(),
        )  # fmt: skip
    assert res.pod["metadata"]["name"] == "b"
    assert api.deleted == ["a"]  # ours once won, so ours to replace


class _FirstA(random.Random):
    """Keep the listed order, so the restarted pod is tried first."""

    def shuffle(self, x: Any) -> None:  # type: ignore[override]
        x.sort(key=lambda p: p["metadata"]["name"])
