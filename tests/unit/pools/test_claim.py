"""The claim patch (applied to pods, including a lost race) and the claim order."""

from __future__ import annotations

import copy
import datetime as dt
import random
from typing import Any

import aiohttp
import pytest

from sandman.contract import ANN_EXPIRES_AT, LABEL_POOL, LABEL_SANDBOX, LABEL_STATE
from sandman.kube_async import ApiError
from sandman.pools.claim import claim_patch, patch_outcome, rank, stamped_by
from sandman.pools.spec import ANN_CLAIMED_AT, ANN_CLAIMED_BY, STATE_CLAIMED, STATE_IDLE
from tests.unit.webhook.jsonpatch import apply

NOW = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)
TTL = dt.timedelta(minutes=30)
STATE_PATH = "/metadata/labels/sandman.dev~1state"
OWNER = [
    {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": "pool-p",
        "uid": "rs-uid",
        "controller": True,
        "blockOwnerDeletion": True,
    }
]


class Conflict(Exception):
    """A test op failed: the apiserver would answer 422."""


def _resolve(doc: Any, path: str) -> tuple[Any, str]:
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    for p in parents:
        doc = doc[p]
    return doc, last


def apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The vendored applier, plus the apiserver's reading of a null test
    (the member is absent or null) and failed tests as Conflict."""
    for op in ops:
        try:
            if op["op"] == "test" and op["value"] is None:
                parent, last = _resolve(doc, op["path"])
                if parent.get(last) is not None:
                    raise Conflict(op)
            else:
                doc = apply(doc, [op])
        except (AssertionError, KeyError) as e:
            raise Conflict(op) from e
    return doc


def pod(
    name: str = "p-1",
    *,
    uid: str | None = None,
    state: str | None = STATE_IDLE,
    annotations: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
    ready: bool = False,
    created: str = "2026-11-30T11:00:00Z",
    deleting: bool = False,
    waiting: tuple[str, str] | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    labels = {LABEL_SANDBOX: "true", LABEL_POOL: "p"}
    if state is not None:
        labels[LABEL_STATE] = state
    md: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": uid or f"uid-{name}",
        "labels": labels,
        "creationTimestamp": created,
    }
    if annotations is not None:
        md["annotations"] = annotations
    if owners is not None:
        md["ownerReferences"] = owners
    if deleting:
        md["deletionTimestamp"] = "2026-11-30T11:59:00Z"
    status: dict[str, Any] = {"phase": "Running" if ready else phase}
    if ready:
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    if waiting:
        reason, message = waiting
        status["containerStatuses"] = [
            {
                "name": "main",
                "image": "reg/img:nope",
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": {}, "status": status}


def patch_for(p: dict[str, Any], claimer: str = "me") -> list[dict[str, Any]]:
    return claim_patch(p, claimer=claimer, now=NOW, ttl=TTL)


# -- the patch ------------------------------------------------------------------
def test_patch_guards_then_flips_state():
    ops = patch_for(pod(owners=OWNER, annotations={"a": "b"}))
    assert ops[:5] == [
        {"op": "test", "path": "/metadata/uid", "value": "uid-p-1"},
        {"op": "test", "path": STATE_PATH, "value": STATE_IDLE},
        {"op": "test", "path": "/metadata/deletionTimestamp", "value": None},
        {"op": "test", "path": "/metadata/labels/sandman.dev~1claim", "value": None},
        {"op": "add", "path": "/metadata/labels/sandman.dev~1claim", "value": "held"},
    ]
    assert {"op": "replace", "path": STATE_PATH, "value": STATE_CLAIMED} in ops
    assert {"op": "add", "path": "/metadata/annotations", "value": {}} not in ops
    ann_ops = [op for op in ops if op["path"].startswith("/metadata/annotations/")]
    assert ann_ops == [
        {"op": "add", "path": "/metadata/annotations/sandman.dev~1claimed-by", "value": "me"},
        {
            "op": "add",
            "path": "/metadata/annotations/sandman.dev~1claimed-at",
            "value": "2026-11-30T12:00:00Z",
        },
        {
            "op": "add",
            "path": "/metadata/annotations/sandman.dev~1expires-at",
            "value": "2026-11-30T12:30:00Z",
        },
    ]
    assert ops[-2:] == [
        {"op": "test", "path": "/metadata/ownerReferences", "value": OWNER},
        {"op": "remove", "path": "/metadata/ownerReferences"},
    ]


def test_applied_patch_claims_the_pod():
    before = pod(owners=OWNER, annotations={"sandman.dev/ttl": "2h", "other": "x"})
    snapshot = copy.deepcopy(before)
    after = apply_patch(before, patch_for(before, claimer="trainer-7"))
    md = after["metadata"]
    assert md["labels"][LABEL_STATE] == STATE_CLAIMED
    assert md["labels"][LABEL_POOL] == "p"  # the pool label stays: claimed pods are counted
    assert md["annotations"] == {
        "sandman.dev/ttl": "2h",  # existing annotations are kept
        "other": "x",
        ANN_CLAIMED_BY: "trainer-7",
        ANN_CLAIMED_AT: "2026-11-30T12:00:00Z",
        ANN_EXPIRES_AT: "2026-11-30T12:30:00Z",
    }
    assert "ownerReferences" not in md
    assert before == snapshot  # building the patch does not touch the pod


@pytest.mark.parametrize("annotations", [None, {}], ids=["no-map", "empty-map"])
def test_pod_without_annotations_gets_a_map_first(annotations):
    p = pod(annotations=annotations, owners=OWNER)
    ops = patch_for(p)
    add_map = {"op": "add", "path": "/metadata/annotations", "value": {}}
    assert add_map in ops
    first_ann = next(
        i for i, op in enumerate(ops) if op["path"].startswith("/metadata/annotations/")
    )
    assert ops.index(add_map) < first_ann
    after = apply_patch(p, ops)
    assert after["metadata"]["annotations"] == {
        ANN_CLAIMED_BY: "me",
        ANN_CLAIMED_AT: "2026-11-30T12:00:00Z",
        ANN_EXPIRES_AT: "2026-11-30T12:30:00Z",
    }
    assert after["metadata"]["labels"][LABEL_STATE] == STATE_CLAIMED


@pytest.mark.parametrize("owners", [None, []], ids=["absent", "empty"])
def test_owner_references_untouched_when_absent(owners):
    p = pod(owners=owners, annotations={"a": "b"})
    ops = patch_for(p)
    assert not [op for op in ops if op["path"] == "/metadata/ownerReferences"]
    after = apply_patch(p, ops)  # a remove of a missing member would fail the whole patch
    assert after["metadata"]["labels"][LABEL_STATE] == STATE_CLAIMED
    assert after["metadata"].get("ownerReferences") == owners


def test_ttl_sets_expiry_and_now_is_written_in_utc():
    east = dt.timezone(dt.timedelta(hours=2))
    ops = claim_patch(
        pod(annotations={}),
        claimer="x",
        now=dt.datetime(2026, 1, 1, 14, 0, 0, tzinfo=east),
        ttl=dt.timedelta(hours=1, seconds=5),
    )
    values = {op["path"].rsplit("~1", 1)[-1]: op["value"] for op in ops if op["op"] == "add"}
    assert values["claimed-at"] == "2026-01-01T12:00:00Z"
    assert values["expires-at"] == "2026-01-01T13:00:05Z"


def test_second_claimer_with_the_same_snapshot_loses():
    seen = pod(owners=OWNER)
    first = apply_patch(seen, patch_for(seen, claimer="a"))
    with pytest.raises(Conflict):
        apply_patch(first, patch_for(seen, claimer="b"))
    assert first["metadata"]["annotations"][ANN_CLAIMED_BY] == "a"


@pytest.mark.parametrize(
    "change",
    ["uid", "state", "deleting", "owner", "no-state-label"],
)
def test_claim_fails_when_the_pod_changed_under_us(change):
    seen = pod(owners=OWNER)
    live = copy.deepcopy(seen)
    md = live["metadata"]
    if change == "uid":  # same name, a new pod
        md["uid"] = "another"
    elif change == "state":
        md["labels"][LABEL_STATE] = STATE_CLAIMED
    elif change == "deleting":
        md["deletionTimestamp"] = "2026-11-30T12:00:00Z"
    elif change == "owner":
        md["ownerReferences"] = [{**OWNER[0], "uid": "other-rs"}]
    else:
        del md["labels"][LABEL_STATE]
    with pytest.raises(Conflict):
        apply_patch(live, patch_for(seen))


# -- the order --------------------------------------------------------------------
def names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def test_rank_ready_first_then_starting_oldest_first():
    pods = [
        pod("s-new", created="2026-11-30T11:30:00Z"),
        pod("r-1", ready=True),
        pod("s-old", created="2026-11-30T10:00:00Z"),
        pod("r-2", ready=True),
        pod("s-mid", created="2026-11-30T11:00:00Z"),
        pod("r-3", ready=True),
    ]
    for seed in range(20):
        got = names(rank(pods, random.Random(seed)))
        assert sorted(got[:3]) == ["r-1", "r-2", "r-3"]
        assert got[3:] == ["s-old", "s-mid", "s-new"]


def test_rank_shuffles_ready_pods_per_rng():
    pods = [pod(f"r-{i}", ready=True) for i in range(8)]
    orders = {tuple(names(rank(pods, random.Random(seed)))) for seed in range(10)}
    assert len(orders) > 1  # claimers spread out
    assert names(rank(pods, random.Random(3))) == names(rank(pods, random.Random(3)))


def test_rank_does_not_mutate_its_input():
    pods = [pod("s-b", created="2026-11-30T11:00:00Z"), pod("s-a", created="2026-11-30T10:00:00Z")]
    before = copy.deepcopy(pods)
    assert names(rank(pods, random.Random(0))) == ["s-a", "s-b"]
    assert pods == before


def test_rank_excludes_pods_that_are_not_claimable():
    pods = [
        pod("ok-ready", ready=True),
        pod("ok-starting"),
        pod("terminating-ready", ready=True, deleting=True),
        pod("terminating-starting", deleting=True),
        pod("claimed", state=STATE_CLAIMED, ready=True),
        pod("no-state", state=None, ready=True),
        pod("other-state", state="draining", ready=True),
        pod("missing-image", waiting=("ErrImagePull", "rpc error: manifest unknown")),
        pod("missing-image-backoff", waiting=("ImagePullBackOff", "reg/img:nope: not found")),
        pod("bad-name", waiting=("InvalidImageName", "bad ref")),
        pod("crashloop", waiting=("CrashLoopBackOff", "back-off 10s")),
        pod("ended", phase="Failed"),
    ]
    assert sorted(names(rank(pods, random.Random(0)))) == ["ok-ready", "ok-starting"]


def test_rank_keeps_unschedulable_pods_as_starting():
    p = pod("pending")
    p["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "full"}
    ]
    assert names(rank([p], random.Random(0))) == ["pending"]


def test_rank_empty():
    assert rank([], random.Random(0)) == []


# -- a claim patch whose answer failed ---------------------------------------------------
@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (ApiError(422, {"message": "test failed"}), "lost"),  # someone else won
        (ApiError(404, {}), "lost"),
        (ApiError(409, {}), "lost"),
        (ApiError(403, {"message": "lease beyond the max lifetime"}), "lost"),
        (ApiError(500, {"message": 'failed calling webhook "policy.sandman.dev"'}), "unknown"),
        (ApiError(504, {"message": "timeout"}), "unknown"),
        (ApiError(429, {}), "unknown"),
        (TimeoutError(), "unknown"),
        (aiohttp.ServerDisconnectedError(), "unknown"),
        (ApiError(400, {"message": "bad patch"}), "fatal"),
        (ApiError(401, {}), "fatal"),
        (ValueError("bug"), "fatal"),
    ],
)
def test_patch_outcome(error: BaseException, outcome: str) -> None:
    assert patch_outcome(error) == outcome


def test_a_pod_read_back_is_ours_only_with_our_own_stamp() -> None:
    won = apply_patch(pod(), patch_for(pod(), claimer="fleet-a"))  # as a claim at NOW leaves it
    assert stamped_by(won, "fleet-a", NOW)
    assert not stamped_by(won, "fleet-b", NOW)  # another claimer's win
    assert not stamped_by(won, "fleet-a", NOW + dt.timedelta(seconds=1))  # not this claim's
    assert not stamped_by(pod(), "fleet-a", NOW)  # never claimed
