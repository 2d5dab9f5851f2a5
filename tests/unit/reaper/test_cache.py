"""The reaper's cached view of a pod decides exactly as the whole pod does.

The view (``reaper/cache.py``) drops what the reaper never reads, so that its
cache stays small at tens of thousands of sandboxes; every rule it runs on
the cache (``decide`` at many instants, ``trust``, the inventory) must give
the same answer on the view. The pods: a real injected sandbox as the
apiserver served it (``bench/data/sandbox_pod.json``: kwok node, Running,
Ready) and variants touching every field those rules read.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from sandman import tokens
from sandman.contract import (
    ANN_ADMITTED,
    ANN_EXIT_WITH_COMMAND,
    ANN_EXPIRES_AT,
    ANN_IDLE_TIMEOUT,
    ANN_KEY_ID,
    LABEL_ID,
    LABEL_POOL,
    LABEL_STATE,
)
from sandman.reaper.cache import cached_view
from sandman.reaper.decide import StuckLimits, decide
from sandman.reaper.trust import trust
from sandman.telemetry.inventory import take
from sandman.tokens import AdmissionKeys, KeyRing

POD = json.loads((Path(__file__).parents[3] / "bench" / "data" / "sandbox_pod.json").read_text())
K = b"k" * 32
KEYS = AdmissionKeys().merged(KeyRing(K, "g1"))
LIMITS = StuckLimits(
    pending=dt.timedelta(minutes=10),
    failing=dt.timedelta(minutes=2),
    not_ready=dt.timedelta(minutes=15),
)


def variant(change: Any) -> dict[str, Any]:
    p = copy.deepcopy(POD)
    change(p)
    return p


def _admitted(p: dict[str, Any]) -> None:
    md = p["metadata"]
    sid = md["labels"][LABEL_ID]
    md["annotations"][ANN_KEY_ID] = "g1"
    md["annotations"][ANN_ADMITTED] = tokens.admission_marker(
        tokens.admission_key(K), md["namespace"], sid, "g1"
    )


VARIANTS = {
    "as-served": lambda p: None,
    "admitted": _admitted,
    "pending": lambda p: p["status"].update(phase="Pending", conditions=[]),
    "pull-failing": lambda p: p["status"].update(
        containerStatuses=[{"name": "main", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]
    ),
    "exited": lambda p: p["status"].update(phase="Succeeded"),
    "exits-with-command": lambda p: p["spec"]["containers"][0]["command"].insert(
        5, "--exit-with-command"
    ),
    "exit-annotation": lambda p: p["metadata"]["annotations"].update(
        {ANN_EXIT_WITH_COMMAND: "true"}
    ),
    "idle-timeout": lambda p: p["metadata"]["annotations"].update({ANN_IDLE_TIMEOUT: "5m"}),
    "owned": lambda p: p["metadata"].update(
        ownerReferences=[{"kind": "ReplicaSet", "name": "rs", "controller": True, "uid": "u"}]
    ),
    "pool-idle": lambda p: p["metadata"]["labels"].update({LABEL_POOL: "x", LABEL_STATE: "idle"}),
    "terminating": lambda p: p["metadata"].update(deletionTimestamp="2026-12-01T10:00:00Z"),
    "huge-user-annotation": lambda p: p["metadata"]["annotations"].update(
        {"kubectl.kubernetes.io/last-applied-configuration": "x" * 100_000}
    ),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_rule_answers_the_same_on_the_view(name: str) -> None:
    pod = variant(VARIANTS[name])
    view = cached_view(pod)
    expires = dt.datetime.fromisoformat(
        pod["metadata"]["annotations"][ANN_EXPIRES_AT].replace("Z", "+00:00")
    )
    # Instants on both sides of the lease end and of the stuck limits.
    for offset_s in (-3600, -1, 0, 1, 600, 3600, 86400):
        now = expires + dt.timedelta(seconds=offset_s)
        for idle_since in (None, now - dt.timedelta(minutes=10)):
            assert decide(view, now, LIMITS, idle_since=idle_since) == decide(
                pod, now, LIMITS, idle_since=idle_since
            ), (name, offset_s)
    assert trust(view, KEYS) is trust(pod, KEYS)
    assert take([view], expires) == take([pod], expires)
    # Identity for the informer and the delete preconditions.
    for k in ("name", "namespace", "uid", "resourceVersion"):
        assert view["metadata"][k] == pod["metadata"][k]


def test_the_view_is_a_fraction_of_the_pod() -> None:
    view = cached_view(variant(VARIANTS["huge-user-annotation"]))
    assert "managedFields" not in view["metadata"]
    assert len(json.dumps(view)) < len(json.dumps(POD)) / 2
