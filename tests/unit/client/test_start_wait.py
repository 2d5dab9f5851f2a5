"""Waiting for a sandbox to start: one shared pod watch per namespace, and the
daemon asked directly once its container may run.

The Kubernetes side is a scripted stand-in for the two calls the waiters make
(``list`` for a starting resourceVersion, ``watch``) plus ``get``; the real
apiserver path is covered by tests/integration/test_sdk_start.py.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandman.client import Sandbox, SandboxStartError, SandmanClient, startup
from sandman.kube_async import ApiError, WatchExpired
from sandman.tokens import namespace_key

KEY = namespace_key(b"k" * 32, "ns", "ns-uid")


def pod(name: str, rv: int, *, ip: str | None = None, ready: bool = False, init: str | None = None):
    status: dict[str, Any] = {"phase": "Pending"}
    spec: dict[str, Any] = {"containers": [{"name": "main"}]}
    if ip:
        status["podIP"] = ip
    if ready:
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    if init is not None:
        spec["initContainers"] = [{"name": "sandman-install"}]
        state = {"terminated": {"exitCode": 0}} if init == "done" else {"running": {}}
        status["initContainerStatuses"] = [{"name": "sandman-install", "state": state}]
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
            "labels": {"sandman.dev/id": name},
        },
        "spec": spec,
        "status": status,
    }


class FakeKube:
    """``list``/``watch``/``get`` of pods; watch streams what the test feeds."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.feed: asyncio.Queue[Any] = asyncio.Queue()
        self.lists = self.watches = 0
        self.gets: list[str] = []

    def open(self) -> None: ...

    async def close(self) -> None: ...

    async def list(self, res: Any, namespace: str, **params: Any) -> dict[str, Any]:
        self.lists += 1
        return {"metadata": {"resourceVersion": "100"}, "items": []}

    async def watch(self, res: Any, namespace: str, **kw: Any) -> AsyncIterator[tuple[str, Any]]:
        self.watches += 1
        while True:
            ev = await self.feed.get()
            if isinstance(ev, BaseException):
                raise ev
            if ev is None:  # the request's timeout: the watch ends normally
                return
            yield ev

    async def get(self, res: Any, name: str, namespace: str) -> dict[str, Any]:
        self.gets.append(name)
        if name not in self.pods:
            raise ApiError(404, {"reason": "NotFound"})
        return copy.deepcopy(self.pods[name])

    def update(self, p: dict[str, Any], kind: str = "MODIFIED") -> None:
        self.pods[p["metadata"]["name"]] = p
        self.feed.put_nowait((kind, copy.deepcopy(p)))


class Daemons:
    """The transport's direct question, answered from a set of ready IPs."""

    def __init__(self, direct: bool = True) -> None:
        self.ready: set[str] = set()
        self.asked: list[str] = []
        self.direct = direct

    async def daemon_ready(self, ip: str, timeout: float = 1.0) -> bool | None:
        self.asked.append(ip)
        if not self.direct:
            return None
        return ip in self.ready

    async def close(self) -> None: ...


def client(kube: FakeKube, daemons: Daemons | None = None) -> SandmanClient:
    return SandmanClient(
        kube=kube,  # type: ignore[arg-type]
        namespace="ns",
        transport=daemons or Daemons(direct=False),  # type: ignore[arg-type]
        access_keys={"ns": KEY},
    )


async def eventually(pred: Any, what: str, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.01)


# -- the shared watch -------------------------------------------------------------------
async def test_waiters_of_a_namespace_share_one_watch_and_hear_only_their_pod() -> None:
    kube = FakeKube()
    async with client(kube) as c:
        sbs = [Sandbox(c, pod(f"p{i}", 5)) for i in range(20)]
        for sb in sbs:
            kube.pods[sb.name] = pod(sb.name, 5)
        waits = [asyncio.ensure_future(sb.wait_ready(5)) for sb in sbs]
        await eventually(lambda: len(kube.gets) == 20, "every waiter read its pod")
        for i, sb in enumerate(sbs):
            kube.update(pod(sb.name, 200 + i, ip=f"10.0.0.{i}", ready=True))
        await asyncio.gather(*waits)
        assert kube.watches == 1 and kube.lists == 1 and c.pod_watch.watches_started == 1
        assert [sb.ip for sb in sbs] == [f"10.0.0.{i}" for i in range(20)]
        # The last waiter gone, the watch stops; the next one starts another.
        await eventually(lambda: not c.pod_watch._groups, "the watch stopped")
        sb = Sandbox(c, pod("late", 5))
        kube.pods["late"] = pod("late", 300, ready=True)
        await sb.wait_ready(5)
        assert c.pod_watch.watches_started == 2


async def test_an_older_event_or_another_pod_of_the_name_is_ignored() -> None:
    kube = FakeKube()
    async with client(kube) as c:
        sb = Sandbox(c, pod("p", 5))
        kube.pods["p"] = pod("p", 50)
        w = asyncio.ensure_future(sb.wait_ready(5))
        await eventually(lambda: kube.gets == ["p"], "the read")
        stale = pod("p", 40, ready=True)  # older than the read
        other = pod("p", 60, ready=True)
        other["metadata"]["uid"] = "someone-else"
        kube.feed.put_nowait(("MODIFIED", stale))
        kube.feed.put_nowait(("MODIFIED", other))
        await asyncio.sleep(0.05)
        assert not w.done()
        kube.update(pod("p", 70, ready=True))
        await w


async def test_an_expired_watch_starts_over_and_waiters_read_again() -> None:
    kube = FakeKube()
    async with client(kube) as c:
        sb = Sandbox(c, pod("p", 5))
        kube.pods["p"] = pod("p", 50)
        w = asyncio.ensure_future(sb.wait_ready(5))
        await eventually(lambda: kube.gets == ["p"], "the first read")
        kube.pods["p"] = pod("p", 90, ready=True)  # changed while nobody watched
        kube.feed.put_nowait(WatchExpired())
        await w
        assert kube.lists == 2 and kube.gets == ["p", "p"]


async def test_a_watch_error_reaches_every_waiter() -> None:
    kube = FakeKube()
    async with client(kube) as c:
        sbs = [Sandbox(c, pod(f"p{i}", 5)) for i in range(3)]
        for sb in sbs:
            kube.pods[sb.name] = pod(sb.name, 5)
        waits = [asyncio.ensure_future(sb.wait_ready(5)) for sb in sbs]
        await eventually(lambda: len(kube.gets) == 3, "the reads")
        kube.feed.put_nowait(ApiError(403, {"message": "watch forbidden"}))
        got = await asyncio.gather(*waits, return_exceptions=True)
        assert all(isinstance(e, ApiError) and e.status == 403 for e in got), got


async def test_a_deleted_pod_fails_the_wait_as_retryable() -> None:
    kube = FakeKube()
    async with client(kube) as c:
        sb = Sandbox(c, pod("p", 5))
        kube.pods["p"] = pod("p", 50)
        w = asyncio.ensure_future(sb.wait_ready(5))
        await eventually(lambda: kube.gets == ["p"], "the read")
        kube.update(pod("p", 60), kind="DELETED")
        with pytest.raises(SandboxStartError) as e:
            await w
        assert e.value.reason == SandboxStartError.DELETED and e.value.retryable


# -- asking the daemon directly ---------------------------------------------------------
async def test_the_daemon_is_asked_once_the_init_container_ended_and_wins_the_race() -> None:
    kube, daemons = FakeKube(), Daemons()
    async with client(kube, daemons) as c:
        sb = Sandbox(c, pod("p", 5))
        kube.pods["p"] = pod("p", 50, ip="10.0.0.7", init="running")
        w = asyncio.ensure_future(sb.wait_ready(5))
        await asyncio.sleep(0.2)
        assert daemons.asked == []  # the install step still runs: nothing to ask yet
        kube.update(pod("p", 60, ip="10.0.0.7", init="done"))  # the kubelet starts `main`
        await eventually(lambda: len(daemons.asked) >= 2, "the daemon asked")
        assert not w.done()  # not ready yet: keeps asking
        daemons.ready.add("10.0.0.7")
        await w  # no Ready condition ever came: the daemon's answer sufficed
        assert sb.timings.ready is not None and not startup.ready(sb.pod)


async def test_through_the_apiserver_only_the_ready_condition_counts() -> None:
    kube, daemons = FakeKube(), Daemons(direct=False)
    async with client(kube, daemons) as c:
        sb = Sandbox(c, pod("p", 5))
        kube.pods["p"] = pod("p", 50, ip="10.0.0.7")
        w = asyncio.ensure_future(sb.wait_ready(5))
        await eventually(lambda: daemons.asked == ["10.0.0.7"], "asked once")
        await asyncio.sleep(0.2)
        assert daemons.asked == ["10.0.0.7"] and not w.done()  # asked once, then left alone
        kube.update(pod("p", 60, ip="10.0.0.7", ready=True))
        await w


def test_daemon_may_answer_needs_an_ip_and_ended_init_containers() -> None:
    assert not startup.daemon_may_answer(pod("p", 1))
    assert startup.daemon_may_answer(pod("p", 1, ip="10.0.0.1"))
    assert not startup.daemon_may_answer(pod("p", 1, ip="10.0.0.1", init="running"))
    assert startup.daemon_may_answer(pod("p", 1, ip="10.0.0.1", init="done"))
    failed = pod("p", 1, ip="10.0.0.1", init="done")
    failed["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] = 1
    assert not startup.daemon_may_answer(failed)
    sidecar = pod("p", 1, ip="10.0.0.1", init="running")
    sidecar["spec"]["initContainers"][0]["restartPolicy"] = "Always"
    assert not startup.daemon_may_answer(sidecar)
    sidecar["status"]["initContainerStatuses"][0]["started"] = True
    assert startup.daemon_may_answer(sidecar)
