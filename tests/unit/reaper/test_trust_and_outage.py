"""Which pods the reaper may touch, and when a lease waits for the webhook (pure)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from sandman import tokens
from sandman.contract import ANN_ADMITTED, ANN_KEY_ID, LABEL_ID, LABEL_SANDBOX
from sandman.reaper.outage import AdmissionHealth
from sandman.reaper.trust import Trust, trust
from sandman.tokens import AdmissionKeys, KeyRing

K = b"k" * 32
RING = KeyRing(K, "g1")
KEYS = AdmissionKeys().merged(RING)
T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
S = dt.timedelta(seconds=1)
GRACE = dt.timedelta(minutes=2)


def pod(ns: str = "team-a", sid: str = "s1", kid: str = "g1", marker: str | None = None) -> Any:
    if marker is None:
        marker = tokens.admission_marker(tokens.admission_key(K), ns, sid, kid)
    return {
        "metadata": {
            "namespace": ns,
            "labels": {LABEL_SANDBOX: "true", LABEL_ID: sid},
            "annotations": {ANN_ADMITTED: marker, ANN_KEY_ID: kid},
        }
    }


def test_only_what_the_webhook_admitted_is_acted_on() -> None:
    assert trust(pod(), KEYS) is Trust.ADMITTED
    # A label is not proof: no marker, a made-up one, one copied from another
    # sandbox (id or namespace differ), one for a generation nobody has.
    bare = pod()
    bare["metadata"]["annotations"] = {}
    assert trust(bare, KEYS) is Trust.UNVERIFIED
    assert trust(pod(marker="0" * 64), KEYS) is Trust.UNVERIFIED
    stolen = pod()["metadata"]["annotations"][ANN_ADMITTED]
    assert trust(pod(sid="s2", marker=stolen), KEYS) is Trust.UNVERIFIED
    assert trust(pod(ns="team-b", marker=stolen), KEYS) is Trust.UNVERIFIED
    assert trust(pod(kid="zz"), KEYS) is Trust.UNVERIFIED
    assert trust(pod(), None) is Trust.UNVERIFIED  # keys not read yet


@pytest.mark.parametrize("ns", ["kube-system", "kube-public", "kube-node-lease", "sandman-system"])
def test_system_namespaces_are_never_touched_even_with_a_valid_marker(ns: str) -> None:
    assert trust(pod(ns=ns), KEYS) is Trust.SYSTEM


def test_a_retired_generation_is_reclaimed() -> None:
    rotated = RING.rotated(T0, overlap=dt.timedelta(hours=1))
    keys = KEYS.merged(rotated).merged(rotated.expired(T0 + dt.timedelta(hours=1)))
    assert trust(pod(kid="g1"), keys) is Trust.RETIRED
    new = pod(kid=rotated.current_id, marker=None)
    new["metadata"]["annotations"][ANN_ADMITTED] = tokens.admission_marker(
        tokens.admission_key(rotated.current), "team-a", "s1", rotated.current_id
    )
    assert trust(new, keys) is Trust.ADMITTED


def test_leases_wait_while_the_webhook_is_unknown_or_down() -> None:
    h = AdmissionHealth()
    assert h.hold_until(T0, T0, GRACE) == T0  # no probe answered yet: look again
    h.observe(T0, ok=False)
    assert h.hold_until(T0, T0 + 10 * S, GRACE) == T0 + 10 * S  # down: look again
    assert h.hold_until(T0, T0 + 10 * S, dt.timedelta(0)) is None  # grace 0: rule off


def test_a_lease_that_ended_during_an_outage_gets_the_grace_after_it() -> None:
    h = AdmissionHealth()
    h.observe(T0, ok=False)  # down 12:00:00
    h.observe(T0 + 60 * S, ok=True)  # back 12:01:00
    lease_end = T0 + 30 * S  # ended while down
    back = T0 + 60 * S
    # Held until the webhook has been back for the grace: 12:03:00, both sides.
    assert h.hold_until(lease_end, back + GRACE - S, GRACE) == back + GRACE
    assert h.hold_until(lease_end, back + GRACE, GRACE) is None
    # A lease that ended within the grace after the outage began is held too
    # (its client may have been retrying a refused extension): 12:01:00 + 1m59s.
    assert h.hold_until(back + GRACE - S, back + GRACE - S, GRACE) == back + GRACE
    # One that ended a full grace after the outage: not held.
    assert h.hold_until(back + GRACE, back + GRACE, GRACE) is None


def test_an_outage_long_before_the_lease_ended_holds_nothing() -> None:
    h = AdmissionHealth()
    h.observe(T0, ok=False)
    h.observe(T0 + S, ok=True)
    assert h.hold_until(T0 + S + GRACE + S, T0 + dt.timedelta(hours=1), GRACE) is None
