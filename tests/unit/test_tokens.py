"""Keys, tokens, markers and the rotation of the cluster key (pure; the clock is pinned)."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac

import pytest

from sandman import tokens
from sandman.tokens import AccessKeys, AdmissionKeys, KeyRetired, KeyRing, KeySecretError

K = b"k" * 32
NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)


def test_a_recreated_namespace_gets_another_key() -> None:
    # Same name, new UID (deleted and re-created by another team): tokens of the
    # old namespace's sandboxes must mean nothing in the new one.
    old = tokens.namespace_key(K, "team-a", "6b1f0c1e-0000-0000-0000-000000000001")
    new = tokens.namespace_key(K, "team-a", "6b1f0c1e-0000-0000-0000-000000000002")
    assert old != new
    assert tokens.sandbox_token(old, "abc") != tokens.sandbox_token(new, "abc")
    # Name and UID are separated: ("a", "bc") and ("ab", "c") do not collide.
    assert tokens.namespace_key(K, "a", "bc") != tokens.namespace_key(K, "ab", "c")
    with pytest.raises(ValueError, match="no UID"):
        tokens.namespace_key(K, "team-a", "")


def test_a_legacy_secret_reads_as_generation_zero_and_round_trips() -> None:
    ring = KeyRing.from_secret_data({"key": base64.b64encode(K).decode()})
    assert ring.current_id == tokens.LEGACY_KEY_ID and ring.generations() == {"0": K}
    assert KeyRing.from_secret_data(ring.to_secret_data()) == ring


@pytest.mark.parametrize(
    "data",
    [{}, {"key": "not base64!"}, {"key": ""}, {"key": "a2V5", "previous": "%%"}],
)
def test_unreadable_key_secrets_are_clear_errors(data: dict[str, str]) -> None:
    with pytest.raises(KeySecretError):
        KeyRing.from_secret_data(data)


def test_rotation_overlaps_then_retires_the_old_generation() -> None:
    ring = KeyRing(K, "g1")
    rotated = ring.rotated(NOW, overlap=24 * H)
    assert rotated.current != K and rotated.current_id not in ("g1", tokens.LEGACY_KEY_ID)
    assert rotated.previous == K and rotated.previous_id == "g1"
    assert set(rotated.generations()) == {"g1", rotated.current_id}
    assert KeyRing.from_secret_data(rotated.to_secret_data()) == rotated
    with pytest.raises(tokens.RotationInProgress):
        rotated.rotated(NOW, overlap=H)
    # One second before the overlap ends, both; at its end, only the new one.
    assert rotated.expired(NOW + 24 * H - dt.timedelta(seconds=1)) == rotated
    done = rotated.expired(NOW + 24 * H)
    assert done.generations() == {rotated.current_id: rotated.current}
    assert rotated.finished() == done


def test_users_compute_old_tokens_during_the_overlap_only() -> None:
    uid = "u-1"
    ring = KeyRing(K, "g1").rotated(NOW, overlap=H)
    during = AccessKeys.from_secret_data(tokens.access_secret_data(ring, "ns", uid))
    assert during.key_for("g1") == tokens.namespace_key(K, "ns", uid)
    assert during.key_for(ring.current_id) == tokens.namespace_key(ring.current, "ns", uid)
    assert during.key_for(None) == during.key_for(ring.current_id)
    after = AccessKeys.from_secret_data(tokens.access_secret_data(ring.expired(NOW + H), "ns", uid))
    with pytest.raises(KeyRetired, match="'g1'"):
        after.key_for("g1")


def test_markers_verify_only_for_what_the_webhook_wrote() -> None:
    ring = KeyRing(K, "g1")
    adm = AdmissionKeys().merged(ring)
    mark = tokens.admission_marker(tokens.admission_key(K), "ns", "sid1", "g1")
    assert adm.verify("ns", "sid1", "g1", mark)
    assert not adm.verify("ns", "sid2", "g1", mark)  # copied onto another id
    assert not adm.verify("other", "sid1", "g1", mark)  # copied into another namespace
    assert not adm.verify("ns", "sid1", "g2", mark)  # another generation
    assert not adm.verify("ns", "sid1", "g1", "")
    assert not adm.verify("ns", "sid1", "g1", "0" * 64)
    # A namespace key cannot produce a marker (the admission key derives from K).
    forged = tokens.admission_marker(tokens.namespace_key(K, "ns", "u"), "ns", "sid1", "g1")
    assert not adm.verify("ns", "sid1", "g1", forged)


def test_admission_keys_keep_every_generation_and_know_the_retired() -> None:
    ring = KeyRing(K, "g1").rotated(NOW, overlap=H)
    during = AdmissionKeys().merged(ring)
    assert set(during.keys) == {"g1", ring.current_id} and during.retired == frozenset()
    after = during.merged(ring.expired(NOW + H))
    assert set(after.keys) == {"g1", ring.current_id} and after.retired == {"g1"}
    assert AdmissionKeys.from_secret_data(after.to_secret_data()) == after
    old_mark = tokens.admission_marker(tokens.admission_key(K), "ns", "s", "g1")
    assert after.verify("ns", "s", "g1", old_mark)  # still verifiable: reclaimed as retired


def test_sandboxes_from_before_key_ids_stay_reachable_through_the_upgrade_overlap() -> None:
    # A cluster key Secret of the first releases: no key id; K_ns from the name.
    legacy = KeyRing.from_secret_data({"key": base64.b64encode(K).decode()})
    upgraded = legacy.rotated(NOW, tokens.LEGACY_OVERLAP)
    access = AccessKeys.from_secret_data(tokens.access_secret_data(upgraded, "ns", "uid-1"))
    first_release_k_ns = hmac.new(K, b"ns", hashlib.sha256).digest()
    # A pod without sandman.dev/key-id (admitted before) gets the old derivation...
    assert access.key_for(None) == first_release_k_ns == access.key_for("0")
    # ...a new one, the UID-bound key of the new generation.
    assert access.key_for(upgraded.current_id) == tokens.namespace_key(
        upgraded.current, "ns", "uid-1"
    )
    done = AccessKeys.from_secret_data(
        tokens.access_secret_data(upgraded.expired(NOW + tokens.LEGACY_OVERLAP), "ns", "uid-1")
    )
    assert done.key_for(None) == done.key_for(upgraded.current_id)
