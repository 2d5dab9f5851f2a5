"""The extender protocol as kube-scheduler speaks it, and decisions over a sequence of pods."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandman.extender.index import ImageIndex
from sandman.extender.observe import ImageEntry, NodeReport
from sandman.extender.score import ScoreParams, tie_pick
from sandman.extender.wire import (
    ArgsError,
    host_priority_list,
    parse_args,
    prioritize_pod,
    where_body,
)

GB = 10**9
TASK = "127.0.0.1:5000/swe/task-7:v1"
NODES = ["kwok-a", "kwok-b", "kwok-c", "kwok-d", "kwok-e"]


def pod(uid: str, image: str = TASK) -> dict[str, Any]:
    return {
        "metadata": {"name": f"rollout-{uid}", "namespace": "rl", "uid": uid},
        "spec": {
            "schedulerName": "sandman-scheduler",
            "containers": [{"name": "main", "image": image}],
        },
        "status": {"phase": "Pending"},
    }


def args(uid: str, image: str = TASK, nodes: list[str] = NODES) -> dict[str, Any]:
    return {"Pod": pod(uid, image), "Nodes": None, "NodeNames": nodes}


def fresh() -> ImageIndex:
    return ImageIndex(clock=lambda: 0.0)


def test_parse_node_names_and_the_node_list_fallback() -> None:
    a = parse_args(args("u1"))
    assert a.node_names == tuple(NODES) and a.uid == "u1"
    legacy = {"Pod": pod("u2"), "Nodes": {"items": [{"metadata": {"name": "n1"}}]}}
    assert parse_args(legacy).node_names == ("n1",)


@pytest.mark.parametrize(
    "doc",
    [[], {"NodeNames": ["n1"]}, {"Pod": {}, "NodeNames": "n1"}, {"Pod": {}, "NodeNames": [""]}],
)
def test_malformed_args(doc: Any) -> None:
    with pytest.raises(ArgsError):
        parse_args(doc)


def test_host_priority_list_uses_the_go_field_names() -> None:
    body = host_priority_list([("n1", 5), ("n-2.zone", 10)])
    assert body == b'[{"Host":"n1","Score":5},{"Host":"n-2.zone","Score":10}]'
    assert json.loads(host_priority_list([('we"ird', 0)])) == [{"Host": 'we"ird', "Score": 0}]


def test_holder_node_wins() -> None:
    ix = fresh()
    ix.update_node(NodeReport("kwok-c", (ImageEntry((TASK,), 3 * GB),)))
    out = prioritize_pod(ix, parse_args(args("u1")), ScoreParams())
    # kwok-c holds all 3 GB: level 9, unique top, +1 = 10; the others hold
    # nothing and are idle: level 5.
    assert dict(out.ranking.scores) == {n: 10 if n == "kwok-c" else 5 for n in NODES}
    assert json.loads(out.body())[2] == {"Host": "kwok-c", "Score": 10}


def test_a_group_fills_one_node_to_the_limit_then_the_next() -> None:
    ix = fresh()
    params = ScoreParams(crowd_limit=4)
    placed = []
    for k in range(8):
        out = prioritize_pod(ix, parse_args(args(f"u{k}")), params)
        placed.append(out.ranking.winner)
    first = tie_pick(TASK, NODES)
    second = tie_pick(TASK, [n for n in NODES if n != first])
    # Pod 0: every node empty and idle (5); the hash of the image picks `first` (6).
    # Pods 1-3: `first` pulls the image (assumed), 1-3 pods there: saved 0.75,
    #   crowd 1.25*max(0, k-4+1) = 0 -> level 8 (+1 = 9) against 5 elsewhere.
    # Pod 4: `first` has 4 pods: 0.75 - 1.25 = -0.5 -> level 2; the other four
    #   are empty and idle (5, the pull on `first` is this image's own, so not
    #   "another pull"); the hash picks `second` among them.
    # Pods 5-7: `second` pulls it with 1-3 pods: level 8 again.
    assert placed == [first] * 4 + [second] * 4


def test_a_new_image_avoids_a_node_busy_pulling_another() -> None:
    ix = fresh()
    first = prioritize_pod(ix, parse_args(args("u1")), ScoreParams()).ranking.winner
    out = prioritize_pod(ix, parse_args(args("u2", "127.0.0.1:5000/swe/task-8:v1")), ScoreParams())
    # `first` is pulling task-7 (assumed): for task-8 it is empty with one other
    # pull: busy = 0.5*1*1, value -0.5 -> level 2; the others are idle: 5 (one 6).
    scores = dict(out.ranking.scores)
    assert first is not None and scores[first] == 2
    assert out.ranking.winner != first


def test_where_body() -> None:
    ix = fresh()
    ix.update_node(NodeReport("kwok-a", (ImageEntry((TASK,), 3 * GB),)))
    prioritize_pod(ix, parse_args(args("u1", nodes=["kwok-b"])), ScoreParams())
    # The only candidate, kwok-b, wins and is assumed to pull the image.
    assert where_body(ix, TASK) == {
        "image": TASK,
        "key": TASK,
        "sizeBytes": 3 * GB,
        "holders": [{"node": "kwok-a", "evidence": ["reported"]}],
        "pulling": [{"node": "kwok-b", "pods": 1}],
    }
    assert where_body(ix, "Not A Ref") is None
