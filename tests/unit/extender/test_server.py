"""The HTTP surface, booted in-process (most decisions are tested without sockets)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from sandman.extender import cli
from sandman.extender.config import ExtenderConfig
from sandman.extender.index import ImageIndex
from sandman.extender.observe import ImageEntry, NodeReport
from sandman.extender.server import create_app
from sandman.kube_async import Credentials, KubeClient

TASK = "127.0.0.1:5000/swe/task-1:v1"


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    ix = ImageIndex(clock=lambda: 0.0)
    ix.update_node(NodeReport("n2", (ImageEntry((TASK,), 3 * 10**9),)))
    app = create_app(ExtenderConfig(watch=False), None, index=ix)
    async with TestClient(TestServer(app)) as c:
        yield c


async def test_prioritize_answers_a_host_priority_list(client: TestClient) -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"containers": [{"name": "c", "image": TASK}]},
    }
    r = await client.post("/prioritize", json={"Pod": pod, "NodeNames": ["n1", "n2"]})
    assert r.status == 200 and r.content_type == "application/json"
    # n2 holds the image: level 9 + the tie-break point; n1 holds nothing: 5.
    assert await r.json() == [{"Host": "n1", "Score": 5}, {"Host": "n2", "Score": 10}]


async def test_malformed_args_get_400(client: TestClient) -> None:
    r = await client.post("/prioritize", data=b"{not json")
    assert r.status == 400
    r = await client.post("/prioritize", json={"NodeNames": ["n1"]})
    assert r.status == 400 and "Pod" in (await r.json())["error"]


async def test_images_endpoint(client: TestClient) -> None:
    r = await client.get("/v1/images", params={"image": TASK})
    doc = await r.json()
    assert r.status == 200 and doc["holders"] == [{"node": "n2", "evidence": ["reported"]}]
    r = await client.get("/v1/images")
    assert r.status == 400


async def test_health_ready_metrics(client: TestClient) -> None:
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200  # a caller-filled index
    await client.post("/prioritize", json={"Pod": {}, "NodeNames": ["n1"]})
    text = await (await client.get("/metrics")).text()
    for name in (
        "sandman_extender_request_duration_seconds_bucket",
        'sandman_extender_requests_total{code="200",verb="prioritize"} 1.0',
        "sandman_extender_nodes_tracked 1.0",
        "sandman_extender_images_tracked 1.0",
        "sandman_extender_index_entries 1.0",
    ):
        assert name in text


async def test_not_ready_until_the_watches_have_listed() -> None:
    # An apiserver that never answers (nothing listens on port 1): the informers
    # retry with backoff, and readiness stays false.
    kube = KubeClient(Credentials("https://127.0.0.1:1", ssl.create_default_context()))
    app = create_app(ExtenderConfig(), kube)
    async with TestClient(TestServer(app)) as c:
        r = await c.get("/readyz")
        assert r.status == 503
        assert (await r.json())["waiting_for"] == ["nodes", "pods"]
        # Scores from a half-listed index would be wrong: the scheduler gets an
        # error and decides without us.
        r = await c.post("/prioritize", json={"Pod": {}, "NodeNames": ["n1"]})
        assert r.status == 503


async def test_where_cli_against_a_live_server(
    client: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(client.make_url("")).rstrip("/")
    code = await asyncio.to_thread(cli.main, ["where", TASK, f"--url={url}"])
    assert code == 0
    out = capsys.readouterr().out
    assert "holds    n2  (reported)" in out and "3.00 GB" in out
