"""The scale bench's lease keeper decisions (pure): when a held lease is moved, and where."""

from __future__ import annotations

from sandman.bench.scale_leases import final_ends, next_end


def test_a_lease_with_more_than_the_renewal_fraction_left_is_left_alone() -> None:
    assert next_end(lease_end=1000.0, now=600.0, lease_s=600.0, final=None) is None
    # Moved a whole lease ahead once less than half is left.
    assert next_end(lease_end=1000.0, now=701.0, lease_s=600.0, final=None) == 1301.0


def test_renew_at_sets_how_little_is_left_before_a_move() -> None:
    # A quarter: 150 s of 600 left is not yet too little.
    assert next_end(1000.0, 850.0, 600.0, None, renew_at=0.25) is None
    assert next_end(1000.0, 851.0, 600.0, None, renew_at=0.25) == 1451.0


def test_a_final_end_caps_the_move_and_never_shortens_a_lease() -> None:
    assert next_end(1000.0, 800.0, 600.0, final=1200.0) == 1200.0
    # A final end before the current end: the lease stays where it is.
    assert next_end(1000.0, 800.0, 600.0, final=900.0) is None
    # Already at its final end: nothing to do.
    assert next_end(1200.0, 1100.0, 600.0, final=1200.0) is None


def test_final_ends_spread_evenly_over_the_window_in_order() -> None:
    ends = final_ends(["a", "b", "c", "d"], start=100.0, window_s=40.0)
    assert ends == {"a": 100.0, "b": 110.0, "c": 120.0, "d": 130.0}


def test_the_kwok_nodes_have_room_for_the_burst_and_the_fleet_at_once() -> None:
    import argparse

    from sandman.bench.scale import FLEET_PODS_PER_SLOT, add_args, capacity_needed
    from sandman.bench.scale_env import pods_per_node_nodes

    p = argparse.ArgumentParser()
    add_args(p)
    args = p.parse_args(["--sandboxes", "200", "--burst", "500"])
    # The 500-pod chaos run that had 2,199 unschedulable attempts: 6 nodes.
    assert pods_per_node_nodes(600, 110) == 6
    need = capacity_needed(args)
    assert need == 500 + FLEET_PODS_PER_SLOT * 64 + 100
    assert pods_per_node_nodes(need, 110) == 9
    assert (
        capacity_needed(p.parse_args(["--sandboxes", "200", "--burst", "500", "--no-fleet"])) == 600
    )
    held_only = p.parse_args(["--sandboxes", "12500", "--burst", "0"])
    assert pods_per_node_nodes(capacity_needed(held_only), 110) == 121
