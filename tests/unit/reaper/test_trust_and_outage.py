"""Which pods the reaper may touch, and when a lease waits for the webhook (pure)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from sandman import tokens
from sandman.contract import ANN_ADMITTED, ANN_KEY_ID, LABEL_ID, LABEL_SANDBOX
from sandman.reaper.outage import AdmissionHealth, Hold, Kind, Observation, Outage
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


def up(at: dt.datetime) -> Observation:
    return Observation(at, serving=True)


def down(at: dt.datetime, call_failures: bool | None = False) -> Observation:
    return Observation(at, serving=False, call_failures=call_failures)


def seen(*observations: Observation) -> AdmissionHealth:
    h = AdmissionHealth()
    for o in observations:
        h.observe(o)
    return h


def test_leases_wait_while_the_webhook_is_unknown_or_down() -> None:
    h = AdmissionHealth()
    assert h.hold_until(T0, T0, GRACE) == Hold(T0)  # no probe answered yet: look again
    h = seen(up(T0 - 10 * S), down(T0))  # served, then stopped at 12:00:00
    stopped = Outage(Kind.STOPPED, T0)
    assert h.hold_until(T0, T0 + 10 * S, GRACE) == Hold(T0 + 10 * S, stopped)  # look again
    assert h.hold_until(T0, T0 + 10 * S, dt.timedelta(0)) is None  # grace 0: rule off
    assert "stopped serving at 2026-11-30T12:00:00Z" in stopped.describe()


def test_a_lease_that_ended_during_an_outage_gets_the_grace_after_it() -> None:
    h = seen(up(T0 - S), down(T0), up(T0 + 60 * S))  # down 12:00:00, back 12:01:00
    lease_end = T0 + 30 * S  # ended while down
    back = T0 + 60 * S
    outage = Outage(Kind.STOPPED, T0, back)
    # Held until the webhook has been back for the grace: 12:03:00, both sides.
    assert h.hold_until(lease_end, back + GRACE - S, GRACE) == Hold(back + GRACE, outage)
    assert h.hold_until(lease_end, back + GRACE, GRACE) is None
    # A lease that ended within the grace after the outage began is held too
    # (its client may have been retrying a refused extension): 12:01:00 + 1m59s.
    assert h.hold_until(back + GRACE - S, back + GRACE - S, GRACE) == Hold(back + GRACE, outage)
    # One that ended a full grace after the outage: not held.
    assert h.hold_until(back + GRACE, back + GRACE, GRACE) is None


def test_an_outage_long_before_the_lease_ended_holds_nothing() -> None:
    h = seen(up(T0 - S), down(T0), up(T0 + S))
    assert h.hold_until(T0 + S + GRACE + S, T0 + dt.timedelta(hours=1), GRACE) is None


def test_a_webhook_still_starting_when_the_reaper_starts_is_not_an_outage() -> None:
    # Right after an install: the reaper's probes fail from 12:00:00 to
    # 12:00:40, the apiserver's failure count does not move, then it serves.
    h = seen(down(T0), down(T0 + 5 * S), down(T0 + 40 * S))
    # A lease that ended at 12:00:15 is reclaimed at once (12:00:40): a
    # reading after its end shows no failed call.
    assert h.hold_until(T0 + 15 * S, T0 + 40 * S, GRACE) is None
    # One that ended after the last reading (12:00:41) waits for the next, no Event.
    assert h.hold_until(T0 + 41 * S, T0 + 42 * S, GRACE) == Hold(T0 + 42 * S)
    h.observe(up(T0 + 45 * S))
    # Serving now: nothing to wait for, nothing held (no outage was ever seen).
    assert h.hold_until(T0 + 41 * S, T0 + 45 * S, GRACE) is None
    assert h.current is None and h.last is None


def test_the_apiserver_failing_to_call_a_never_seen_webhook_is_an_outage() -> None:
    # The reaper cannot reach the webhook; the apiserver refused an extension
    # between the readings of 12:00:05 and 12:00:10, and not after.
    h = seen(down(T0), down(T0 + 5 * S), down(T0 + 10 * S, call_failures=True))
    failed = Outage(Kind.CALL_FAILED, T0 + 10 * S)
    assert h.hold_until(T0 + 8 * S, T0 + 10 * S, GRACE) == Hold(T0 + 10 * S, failed)
    assert "the apiserver failed to call the admission webhook at 2026-11-30T12:00:10Z" in (
        failed.describe()
    )
    h.observe(down(T0 + 15 * S))  # no more failures: ended at 12:00:15
    ended = Outage(Kind.CALL_FAILED, T0 + 10 * S, T0 + 15 * S)
    # A lease that ended at 12:00:08 is held until 12:00:15 + 2 min = 12:02:15.
    assert h.hold_until(T0 + 8 * S, T0 + 16 * S, GRACE) == Hold(T0 + 15 * S + GRACE, ended)
    assert h.hold_until(T0 + 8 * S, T0 + 15 * S + GRACE, GRACE) is None


def test_an_unreadable_failure_count_holds_without_guessing() -> None:
    # The webhook never served and the count cannot be read: hold (no delete
    # on a guess), with an Event that says so.
    h = seen(down(T0, call_failures=None))
    unknown = Outage(Kind.UNKNOWN, T0)
    assert h.hold_until(T0 - S, T0 + S, GRACE) == Hold(T0 + S, unknown)
    assert "could not tell" in unknown.describe()
    # The next good reading covers the gap (it is read against the last good
    # one): no failure in it, so nothing is held.
    h.observe(down(T0 + 5 * S, call_failures=False))
    assert h.hold_until(T0 - S, T0 + 5 * S, GRACE) is None and h.last is None


def test_a_webhook_seen_serving_that_fails_is_stopped_whatever_the_count() -> None:
    h = seen(up(T0), down(T0 + 5 * S, call_failures=None))
    assert h.current == Outage(Kind.STOPPED, T0 + 5 * S)
