"""Many sandboxes starting at once through one client, on the real control plane
(pods on kwok nodes): they share one pod watch per namespace instead of one
watch (and one pooled connection) each, so a client with a small connection
pool still starts them all, and the apiserver serves one watch."""

from __future__ import annotations

import asyncio

from sandman.client import Sandbox, SandboxStartError, SandmanClient, startup
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, KWOK_TOLERATION, NODE_KIND_LABEL
from sandman.harness.cluster.local import LocalCluster
from sandman.kube_async import PODS, KubeClient

N = 40
POOL = 8  # connections of the client's Kubernetes pool, far fewer than sandboxes
WAIT_S = 180  # bounds a hang, never a speed


def kwok_sandbox(client: SandmanClient, **kw: object):  # type: ignore[no-untyped-def]
    return Sandbox.create(
        client, KWOK_IMAGE, command=["sleep", "infinity"], timeout_s=WAIT_S,
        node_selector={NODE_KIND_LABEL: "kwok"}, tolerations=[KWOK_TOLERATION],
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


async def test_sandboxes_waiting_at_once_share_one_watch(
    cluster: LocalCluster, namespace: str
) -> None:
    kube = KubeClient.from_kubeconfig(cluster.kubeconfig, max_connections=POOL)
    # Through the apiserver: kwok pods have no daemon to ask, only Ready counts.
    async with SandmanClient(kube=kube, namespace=namespace, transport="proxy") as c:
        async with asyncio.timeout(WAIT_S):
            made = await asyncio.gather(*(kwok_sandbox(c, wait=False) for _ in range(N)))
            watches_before = kube.requests["WATCH"]
            await asyncio.gather(*(sb.wait_ready(WAIT_S) for sb in made))
        assert all(startup.ready(sb.pod) for sb in made)
        # Every waiter joined before any could leave: one watch for all of them.
        assert c.pod_watch.watches_started == 1
        assert kube.requests["WATCH"] - watches_before == 1

        # Create-and-wait all at once through the same small pool also completes.
        async with asyncio.timeout(WAIT_S):
            more = await asyncio.gather(*(kwok_sandbox(c) for _ in range(N)))
        assert all(startup.ready(sb.pod) for sb in more)
        assert kube.requests["WATCH"] - watches_before < N // 4
        await asyncio.gather(*(sb.release() for sb in made + more))


async def test_a_sandbox_deleted_while_waiting_fails_fast_and_others_go_on(
    cluster: LocalCluster, namespace: str
) -> None:
    async with SandmanClient(
        kubeconfig=cluster.kubeconfig, namespace=namespace, transport="proxy"
    ) as c:
        # No node carries this label: the pod stays Pending until deleted.
        stuck = await Sandbox.create(
            c, KWOK_IMAGE, command=["sleep", "infinity"], wait=False,
            node_selector={NODE_KIND_LABEL: "nowhere"}, tolerations=[KWOK_TOLERATION],
        )  # fmt: skip
        waiting = asyncio.ensure_future(stuck.wait_ready(WAIT_S))
        ok = asyncio.ensure_future(kwok_sandbox(c))
        await asyncio.sleep(0)
        await c.kube.delete(PODS, stuck.name, namespace, grace_period_s=0)
        async with asyncio.timeout(WAIT_S):
            try:
                await waiting
                raise AssertionError("the wait of a deleted pod returned")
            except SandboxStartError as e:
                assert e.reason == SandboxStartError.DELETED and e.retryable
            sb = await ok
        assert startup.ready(sb.pod)
        await sb.release()


async def test_a_pod_deleted_during_wait_pod_is_reported_as_such(
    cluster: LocalCluster, namespace: str
) -> None:
    async with SandmanClient(
        kubeconfig=cluster.kubeconfig, namespace=namespace, transport="proxy"
    ) as c:
        sb = await kwok_sandbox(c)  # Ready: what comes next is not a start
        waiting = asyncio.ensure_future(sb.wait_pod(lambda pod: False, timeout_s=WAIT_S))
        await asyncio.sleep(0.2)
        await c.kube.delete(PODS, sb.name, namespace, grace_period_s=0)
        try:
            await waiting
            raise AssertionError("wait_pod on a deleted pod returned")
        except SandboxStartError as e:
            assert e.reason == SandboxStartError.DELETED
            assert "while waiting for its status" in str(e), str(e)
