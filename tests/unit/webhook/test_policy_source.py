"""PolicySource: what each new policy text does, said once."""

from __future__ import annotations

from sandman.webhook.policy_source import Load, PolicySource

GOOD = "rules: [{name: good}]"
OTHER = "rules: [{name: other}, {name: good}]"
BAD = "rules: [{name: bad, mode: sometimes}]"


def test_a_rejected_text_keeps_the_policy_and_is_reported_once() -> None:
    src = PolicySource()
    assert src.load_text(GOOD, "t") is Load.LOADED
    assert src.load_text(BAD, "t") is Load.REJECTED
    assert [r.name for r in src.current().rules] == ["good"]
    assert src.rejected and "mode" in src.rejected
    reason, message, type_ = src.event(Load.REJECTED)
    assert (reason, type_) == ("PolicyRejected", "Warning")
    assert "previous one stays in force" in message
    # A re-list or the file poll sees the same bad text again: no second report.
    assert src.load_text(BAD, "t") is Load.UNCHANGED
    assert src.errors == 1


def test_going_back_to_the_text_in_force_after_a_rejection_is_reported() -> None:
    src = PolicySource()
    src.load_text(GOOD, "t")
    src.load_text(BAD, "t")
    assert src.load_text(GOOD, "t") is Load.LOADED
    assert src.rejected is None
    assert src.load_text(GOOD, "t") is Load.UNCHANGED
    # And the same bad text, written again later, is reported again.
    assert src.load_text(BAD, "t") is Load.REJECTED
    assert src.errors == 2


def test_a_new_good_text_is_loaded() -> None:
    src = PolicySource()
    src.load_text(GOOD, "t")
    assert src.load_text(OTHER, "t") is Load.LOADED
    assert [r.name for r in src.current().rules] == ["other", "good"]
    assert src.event(Load.LOADED) == (
        "PolicyLoaded",
        "policy loaded: 2 rule set(s) in force",
        "Normal",
    )
    assert src.reloads == 2
