"""Node scores for one pod from what the index knows (pure; the formula lives here).

The formula (kube-scheduler extender scores are integers 0..10,
``MaxExtenderPriority``):

    T       = sum of the sizes of the pod's distinct images (init containers
              included; an unknown size counts as DEFAULT_IMAGE_BYTES)
    saved   = (held + PULL_CREDIT * pulling) / T       bytes that need not be pulled
    missing = (T - held - pulling) / T                 bytes this node must fetch afresh
    busy    = BUSY_STEP * min(other_pulls, BUSY_CAP) * missing
    crowd   = CROWD_STEP * max(0, same_image_pods - CROWD_LIMIT + 1)
    value   = saved - busy - crowd                     in [-1, 1] once clamped
    level   = clamp(floor(4.5 * (value + 1) + 0.5), 0, 9)
    score   = level + 1 for the tie-break winner among the nodes with the
              highest level, + 0 for every other node

so that (with the defaults) a node holding everything scores 9, one pulling
it 8, an idle node with nothing 5, the same node busy with one other pull 2,
with two or more 0, and a holder that already runs CROWD_LIMIT pods of the
image 3: below every idle empty node, so a group fills one node and then
spreads, yet above nodes whose pull queues it would join.

Why each part:

- Bytes, not image counts: a cold pull costs time in proportion to bytes (80.9 s
  cold vs 6 s warm for a 1.2 GB image on GKE); a 20 MB sidecar present
  everywhere must not look like half the job done.
- ``pulling`` is credited: a pod joining a pull in progress shares it (the
  kubelet and containerd fetch each layer once), which is what keeps the 4
  rollouts of a new task image from pulling it 4 times.
- ``busy`` only weighs the bytes this node must still fetch: kubelets pull one
  image at a time by default (``serializeImagePulls: true``), so a fresh pull
  queues behind the other images in flight; a node that already holds the
  image starts the pod without queueing, whatever else it pulls.
- ``crowd`` bounds the blast radius and the hot spot: rollouts of one task run
  the same heavy phases at the same moments, and one node failing should not
  take a whole group.
- The tie-break makes our best node unique, so the scheduler (whose other
  scores are small next to ours) takes it, and we can record that placement
  before the binding comes back through the watch: the next pod of a new
  image, scheduled milliseconds later, then sees a pull in progress there
  (level 8) and follows. A hash of the image picks among equals, so different
  new images spread over idle nodes. The +1 never lifts a node past a higher
  level.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

MAX_SCORE = 10  # extenderv1.MaxExtenderPriority
LEVELS = MAX_SCORE  # content levels 0..9; the 10th point is the tie-break

# A pull already in progress saves all of its bytes (shared fetch) but, on
# average, only half of its time (it is half done when we join): we weigh the
# two equally, 0.75. Cost: a holder must beat a puller by one level, and does
# (9 vs 8).
PULL_CREDIT = 0.75
# One other image in flight ahead of ours costs, with serialized pulls, about
# half a pull of similar size on average (it is half done); the task images we
# size for are all 1-3 GB (docs/extender.md), so "half of ours" is 0.5. Two
# queued pulls saturate the penalty (value -1): beyond that the exact queue
# length no longer changes the order, and a node that pulls for others keeps
# some attraction for pods whose image it already holds.
BUSY_STEP = 0.5
BUSY_CAP = 2
# Pods of one image per node before the crowd penalty: 4 = rollouts per
# problem in the RL batch we size for (500 images x 4 rollouts, the placement
# study of docs/extender.md), the group size GRPO-style training commonly
# uses, so one group shares one pull. A bigger group spills to a second
# node, which costs one more pull per CROWD_LIMIT pods.
CROWD_LIMIT = 4
# 1.25 puts a holder at the limit (1 - 1.25 = -0.25, level 3) below an idle
# empty node (level 5) and above a node busy with another pull (level 2):
# spreading wins, but not at the price of queueing behind someone else's pull.
CROWD_STEP = 1.25


@dataclass(frozen=True)
class ScoreParams:
    pull_credit: float = PULL_CREDIT
    busy_step: float = BUSY_STEP
    busy_cap: int = BUSY_CAP
    crowd_limit: int = CROWD_LIMIT
    crowd_step: float = CROWD_STEP


class NodeFacts(NamedTuple):
    """What one node has of one pod's images (bytes), and how loaded it is.

    A NamedTuple, not a dataclass: one is built per interesting node per call,
    and equal facts share one computed level (they hash).
    """

    held_bytes: int = 0
    pulling_bytes: int = 0  # being pulled there and not yet held
    other_pulls: int = 0  # distinct other images being pulled there
    same_image_pods: int = 0  # pods of the pod's largest image on the node


EMPTY = NodeFacts()


def value(f: NodeFacts, total: int, p: ScoreParams) -> float:
    """The formula's ``value`` before rounding (see the module docstring)."""
    if total <= 0:
        return 0.0
    held = min(f.held_bytes, total)
    pulling = min(f.pulling_bytes, total - held)
    saved = (held + p.pull_credit * pulling) / total
    missing = (total - held - pulling) / total
    busy = p.busy_step * min(f.other_pulls, p.busy_cap) * missing
    crowd = p.crowd_step * max(0, f.same_image_pods - p.crowd_limit + 1)
    return saved - busy - crowd


def level(v: float) -> int:
    """``value`` in [-1, 1] onto 0..9, rounding halves up."""
    return max(0, min(LEVELS - 1, math.floor((LEVELS - 1) / 2 * (v + 1) + 0.5)))


def tie_pick(salt: str, tied: Sequence[str]) -> str:
    """The winner among equally good nodes: a hash of the image picks a position.

    The pick needs no stability from one call to the next: the placement
    recorded for the winner (``ImageIndex.assume``) makes it the one best node
    for the next pod of the image. It only has to differ between images, so
    that new images spread over idle nodes. CRC-32 is computed in C and is
    stable across processes; the extender answers for thousands of nodes.
    """
    return tied[zlib.crc32(salt.encode()) % len(tied)]


@dataclass(frozen=True)
class Ranking:
    scores: list[tuple[str, int]]  # (node, 0..10) in the candidates' order
    winner: str | None  # the one node with the highest score


def prioritize(
    total: int,
    facts: Mapping[str, NodeFacts],
    candidates: Sequence[str],
    tie_salt: str,
    params: ScoreParams,
    default: NodeFacts = EMPTY,
) -> Ranking:
    """Scores 0..10 for every candidate, in the candidates' order.

    ``facts`` needs entries only for nodes that differ from ``default`` (an
    empty, idle node unless told otherwise); the others share one level.
    """
    if not candidates:
        return Ranking([], None)
    base = level(value(default, total, params))
    # Thousands of candidates share a few distinct facts: one level each,
    # then one dict lookup per candidate.
    memo = {f: level(value(f, total, params)) for f in set(facts.values())}
    node_level = {n: memo[f] for n, f in facts.items()}
    levels = [node_level.get(n, base) for n in candidates]
    top = max(levels)
    tied = [n for n, lv in zip(candidates, levels, strict=True) if lv == top]
    winner = tie_pick(tie_salt, tied)
    scores = [(n, lv + 1 if n == winner else lv) for n, lv in zip(candidates, levels, strict=True)]
    return Ranking(scores, winner)
