"""Bounds on lookups in flight, and resting hosts (injected clock)."""

from __future__ import annotations

from sandman.webhook.lookup_limits import Counts, HostFailures, InFlight, Limits, over_bound

LIMITS = Limits(per_host=2, per_namespace=3, total=4)


def test_over_bound_checks_host_then_namespace_then_total() -> None:
    c = Counts(total=3, hosts={"a.io": 2, "b.io": 1}, namespaces={"ns1": 3})
    # a.io has 2 of 2
    assert over_bound(LIMITS, c, "a.io", "ns2") == "2 lookups already running for this registry"
    # b.io has room (1 of 2), but ns1 has 3 of 3
    assert over_bound(LIMITS, c, "b.io", "ns1") == ("3 lookups already running for namespace ns1")
    # b.io 1 of 2, ns2 0 of 3, total 3 of 4: one more fits
    assert over_bound(LIMITS, c, "b.io", "ns2") is None
    c.total = 4  # total 4 of 4: nothing more fits anywhere
    assert over_bound(LIMITS, c, "c.io", "ns3") == "4 lookups already running in the webhook"


def test_in_flight_counts_and_gives_slots_back() -> None:
    f = InFlight(LIMITS)
    assert f.start("a.io", "ns") is None and f.start("a.io", "ns") is None
    assert f.start("a.io", "other") == "2 lookups already running for this registry"
    assert f.counts == Counts(2, {"a.io": 2}, {"ns": 2})  # a refusal counts nothing
    f.end("a.io", "ns")
    assert f.start("a.io", "other") is None
    f.end("a.io", "ns")
    f.end("a.io", "other")
    assert f.counts == Counts()  # empty entries are dropped, nothing leaks


def test_a_failed_host_rests_for_rest_s() -> None:
    now = [100.0]
    h = HostFailures(lambda: now[0], rest_s=5, max_hosts=2)
    h.failed("a.io", "timed out")
    now[0] += 4.999
    assert h.resting("a.io") == "timed out"
    now[0] += 0.001  # at 5 s it is asked again
    assert h.resting("a.io") is None
    h.failed("a.io", "unreachable")
    h.failed("b.io", "timed out")
    h.failed("c.io", "timed out")  # bounded: the oldest is forgotten
    assert h.resting("a.io") is None and h.resting("c.io") == "timed out"
