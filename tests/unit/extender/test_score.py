"""The scoring formula, case by case, with the arithmetic worked out.

Defaults: PULL_CREDIT 0.75, BUSY_STEP 0.5, BUSY_CAP 2, CROWD_LIMIT 4,
CROWD_STEP 1.25; level = clamp(floor(4.5 * (value + 1) + 0.5), 0, 9).
"""

from __future__ import annotations

import zlib

import pytest

from sandman.extender.score import (
    MAX_SCORE,
    NodeFacts,
    ScoreParams,
    level,
    prioritize,
    tie_pick,
    value,
)

GB = 10**9
MB = 10**6
P = ScoreParams()


@pytest.mark.parametrize(
    ("facts", "total", "expected"),
    [
        # Holds all 3 GB, one pod of the image there: saved = 3/3 = 1, missing 0,
        # crowd = 1.25 * max(0, 1 - 4 + 1) = 0 -> value 1 -> floor(4.5*2 + .5) = 9.
        (NodeFacts(held_bytes=3 * GB, same_image_pods=1), 3 * GB, 9),
        # Pulling all 3 GB: saved = 0.75 * 3/3 = 0.75 -> floor(4.5*1.75 + .5) = floor(8.375) = 8.
        (NodeFacts(pulling_bytes=3 * GB, same_image_pods=1), 3 * GB, 8),
        # Nothing, idle: value 0 -> floor(4.5 + .5) = 5.
        (NodeFacts(), 3 * GB, 5),
        # Nothing, one other pull: missing 1, busy = 0.5 * 1 * 1 = 0.5, value -0.5
        # -> floor(4.5*0.5 + .5) = floor(2.75) = 2.
        (NodeFacts(other_pulls=1), 3 * GB, 2),
        # Nothing, two other pulls: busy = 0.5 * 2 * 1 = 1, value -1 -> floor(0.5) = 0.
        (NodeFacts(other_pulls=2), 3 * GB, 0),
        # Five other pulls: capped at BUSY_CAP 2, busy 1 again -> 0.
        (NodeFacts(other_pulls=5), 3 * GB, 0),
        # Holds it, busy pulling two others: missing 0, busy = 0.5*2*0 = 0 -> value 1 -> 9.
        (NodeFacts(held_bytes=3 * GB, other_pulls=2), 3 * GB, 9),
        # Holds it, 3 pods there (below the limit): crowd = 1.25*max(0, 3-4+1) = 0 -> 9.
        (NodeFacts(held_bytes=3 * GB, same_image_pods=3), 3 * GB, 9),
        # Holds it, 4 pods (the limit): crowd = 1.25*(4-4+1) = 1.25, value 1 - 1.25 = -0.25
        # -> floor(4.5*0.75 + .5) = floor(3.875) = 3: below an idle empty node (5).
        (NodeFacts(held_bytes=3 * GB, same_image_pods=4), 3 * GB, 3),
        # Holds it, 5 pods: crowd = 1.25*2 = 2.5, value -1.5 -> floor(-1.75) = -2 -> clamp 0.
        (NodeFacts(held_bytes=3 * GB, same_image_pods=5), 3 * GB, 0),
        # Pulling it, 4 pods: value 0.75 - 1.25 = -0.5 -> floor(2.75) = 2.
        (NodeFacts(pulling_bytes=3 * GB, same_image_pods=4), 3 * GB, 2),
        # Two images (3 GB + 1 GB), holds the 1 GB one, idle: saved = 1/4 = 0.25
        # -> floor(4.5*1.25 + .5) = floor(6.125) = 6.
        (NodeFacts(held_bytes=1 * GB), 4 * GB, 6),
        # Holds 3 of 4 GB, one other pull: saved .75, missing .25, busy = .5*1*.25 = .125,
        # value .625 -> floor(4.5*1.625 + .5) = floor(7.8125) = 7.
        (NodeFacts(held_bytes=3 * GB, other_pulls=1), 4 * GB, 7),
        # Holds only the 20 MB daemon of a 3 GB task pod: saved = 20/3020 = 0.0066
        # -> floor(4.5*1.0066 + .5) = floor(5.03) = 5: the same as holding nothing.
        (NodeFacts(held_bytes=20 * MB), 3 * GB + 20 * MB, 5),
        # Holds 1 GB and pulls 2 GB of 3 GB: saved = (1 + .75*2)/3 = 0.8333
        # -> floor(4.5*1.8333 + .5) = floor(8.75) = 8.
        (NodeFacts(held_bytes=1 * GB, pulling_bytes=2 * GB), 3 * GB, 8),
        # A pod with no image sizes at all (total 0): value 0 -> 5 everywhere.
        (NodeFacts(held_bytes=5), 0, 5),
    ],
)
def test_levels(facts: NodeFacts, total: int, expected: int) -> None:
    assert level(value(facts, total, P)) == expected


def test_crowd_limit_is_a_parameter() -> None:
    # Limit 2, two pods, holder: crowd = 1.25*(2-2+1) = 1.25, value -0.25 -> 3.
    p = ScoreParams(crowd_limit=2)
    assert level(value(NodeFacts(held_bytes=GB, same_image_pods=2), GB, p)) == 3
    # One pod: crowd = 1.25*max(0, 1-2+1) = 0 -> value 1 -> 9.
    assert level(value(NodeFacts(held_bytes=GB, same_image_pods=1), GB, p)) == 9


def test_holder_wins_over_emptier_nodes_with_the_tie_break_point() -> None:
    # n2 holds the 3 GB image: level 9, the unique top, +1 -> 10.
    # n1, n3: nothing, idle: level 5 each.
    r = prioritize(3 * GB, {"n2": NodeFacts(held_bytes=3 * GB)}, ["n1", "n2", "n3"], "img", P)
    assert r.scores == [("n1", 5), ("n2", 10), ("n3", 5)]
    assert r.winner == "n2"


def test_ties_pick_one_node_by_a_hash_of_the_image() -> None:
    nodes = [f"n{i}" for i in range(7)]
    # Every node empty and idle: level 5; the pick is position crc32(salt) % 7.
    r = prioritize(GB, {}, nodes, "127.0.0.1:5000/swe/task:v1", P)
    pick = nodes[zlib.crc32(b"127.0.0.1:5000/swe/task:v1") % 7]
    assert r.winner == pick == tie_pick("127.0.0.1:5000/swe/task:v1", nodes)
    assert dict(r.scores) == {n: 6 if n == pick else 5 for n in nodes}
    # Different images spread over the tied nodes.
    winners = {prioritize(GB, {}, nodes, f"img-{k}", P).winner for k in range(40)}
    assert len(winners) >= 5


def test_the_tie_break_only_chooses_among_the_best() -> None:
    # n0 and n2 hold it (9 each), n1 pulls it (8): the extra point goes to n0 or
    # n2, the other stays at 9, n1 keeps 8.
    facts = {
        "n0": NodeFacts(held_bytes=GB),
        "n1": NodeFacts(pulling_bytes=GB),
        "n2": NodeFacts(held_bytes=GB),
    }
    r = prioritize(GB, facts, ["n0", "n1", "n2"], "x", P)
    assert r.winner in ("n0", "n2")
    assert sorted(s for _, s in r.scores) == [8, 9, 10]
    assert max(s for _, s in r.scores) <= MAX_SCORE


def test_no_candidates() -> None:
    r = prioritize(GB, {"n1": NodeFacts(held_bytes=GB)}, [], "x", P)
    assert r.scores == [] and r.winner is None
