"""The webhook's TLS decisions with a pinned clock, probed on both sides of each boundary."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Sequence

from sandman import tls
from sandman.webhook import cert_plan
from sandman.webhook.cert_plan import Cert, Material, Plan

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
CA_VALIDITY = dt.timedelta(days=365)
CERT_VALIDITY = dt.timedelta(days=90)
FRACTION = 1 / 3
DNS = ("sandman-webhook.sandman-system.svc", "localhost")
IPS = ("127.0.0.1",)
SANS = frozenset((*DNS, *IPS))
SECOND = dt.timedelta(seconds=1)


def decide(
    m: Material, now: dt.datetime, trusts: Sequence[frozenset[str]] = (), force: bool = False
) -> Plan:
    """``trusts``: what each webhook's caBundle holds (settled); () means no webhooks."""
    return cert_plan.decide(
        m,
        now=now,
        renew_fraction=FRACTION,
        sans=SANS,
        trusted=cert_plan.trusted_everywhere(trusts),
        force_ca_rotation=force,
    )


def apply(plan: Plan, m: Material, now: dt.datetime) -> Material:
    return cert_plan.apply(
        plan,
        m,
        now=now,
        ca_validity=CA_VALIDITY,
        cert_validity=CERT_VALIDITY,
        dns_names=DNS,
        ip_addresses=IPS,
    )


def material(ca_at: dt.datetime, cert_at: dt.datetime) -> Material:
    """A CA made at ``ca_at`` and a serving cert it signed at ``cert_at``."""
    ca = tls.new_ca("test-ca", now=ca_at, valid_for=CA_VALIDITY)
    serving = tls.issue(ca, DNS[0], now=cert_at, valid_for=CERT_VALIDITY, dns=DNS, ips=IPS)
    return Material(ca, serving, ca.cert_pem)


def cert(pem: bytes | None) -> Cert:
    assert pem is not None
    return Cert.parse(pem)


def bundle_fps(m: Material) -> list[str]:
    return [c.fingerprint for c in cert_plan.parse_bundle(m.bundle)]


def test_fresh_secret_gets_a_ca_and_a_serving_cert_it_signed() -> None:
    plan = decide(Material(), T0, trusts=[frozenset()])
    assert plan.rotate_ca and plan.issue_serving and plan.waiting is None
    m = apply(plan, Material(), T0)
    assert m.ca is not None and m.serving is not None
    ca, serving = cert(m.ca.cert_pem), cert(m.serving.cert_pem)
    assert serving.issued_by(ca)
    assert serving.sans == SANS
    assert bundle_fps(m) == [ca.fingerprint]
    assert serving.not_after == T0 + CERT_VALIDITY
    # Settled: the next pass changes nothing.
    assert not decide(m, T0).changes


def test_secret_round_trips_through_its_data() -> None:
    m = apply(decide(Material(), T0), Material(), T0)
    assert Material.from_secret_data(m.secret_data()) == m
    assert set(m.secret_data()) == {"ca.crt", "ca.key", "tls.crt", "tls.key", "ca-bundle.crt"}
    # Half a Secret (key missing) counts as no CA at all.
    data = m.secret_data()
    del data["ca.key"]
    assert Material.from_secret_data(data).ca is None


def test_serving_cert_is_reissued_once_a_third_of_its_life_is_left() -> None:
    m = material(T0, T0)
    assert m.serving is not None
    serving = cert(m.serving.cert_pem)
    # Lifetime is 90 days + the 1-minute back-dating; renewal at 2/3 of it.
    renew_at = serving.not_after - (serving.not_after - serving.not_before) / 3
    assert serving.renew_at(FRACTION) == renew_at
    assert not decide(m, renew_at - SECOND).changes
    plan = decide(m, renew_at)
    assert plan.issue_serving and not plan.rotate_ca and plan.waiting is None
    after = apply(plan, m, renew_at)
    assert after.ca == m.ca and after.bundle == m.bundle
    assert after.serving is not None and after.serving != m.serving
    assert cert(after.serving.cert_pem).issued_by(cert(m.bundle))


def test_changed_names_reissue_the_serving_cert() -> None:
    m = material(T0, T0)
    plan = cert_plan.decide(
        m, now=T0, renew_fraction=FRACTION, sans=SANS | {"extra.svc"}, trusted=None
    )
    assert plan.issue_serving and not plan.rotate_ca


def test_ca_near_expiry_rotates_and_the_bundle_keeps_the_old_ca() -> None:
    # The serving cert is young at the CA's renewal point, so only the CA is due.
    ca_renew_at = cert(material(T0, T0).bundle).renew_at(FRACTION)
    m = material(T0, ca_renew_at - dt.timedelta(days=10))
    old_ca = cert(m.bundle)
    assert old_ca.renew_at(FRACTION) == ca_renew_at
    trusts_old = [frozenset({old_ca.fingerprint})]
    assert not decide(m, ca_renew_at - SECOND, trusts_old).changes
    plan = decide(m, ca_renew_at, trusts_old)
    assert plan.rotate_ca and not plan.issue_serving
    assert plan.waiting is not None
    after = apply(plan, m, ca_renew_at)
    assert after.ca is not None and after.ca != m.ca
    new_ca = cert(after.ca.cert_pem)
    assert bundle_fps(after) == [new_ca.fingerprint, old_ca.fingerprint]
    # The serving cert did not move: it still verifies against what apiservers trust.
    assert after.serving == m.serving


def rotated(at: dt.datetime) -> Material:
    """A CA and cert made at T0, then a forced CA rotation at ``at`` (cert not moved yet)."""
    m = material(T0, T0)
    return apply(decide(m, at, force=True), m, at)


def test_serving_cert_moves_to_the_new_ca_only_once_every_cabundle_holds_it() -> None:
    m = rotated(T0)
    assert m.ca is not None and m.serving is not None
    new_ca = cert(m.ca.cert_pem)
    old_ca = cert(m.bundle[len(m.ca.cert_pem) :])
    assert not cert(m.serving.cert_pem).issued_by(new_ca)
    old, both = frozenset({old_ca.fingerprint}), frozenset({old_ca.fingerprint, new_ca.fingerprint})
    # One of two webhooks still lacks the new CA: hold.
    assert cert_plan.trusted_everywhere([both, old]) == old
    held = decide(m, T0, [both, old])
    assert not held.changes and held.waiting is not None
    # Every webhook trusts it: switch, and keep the old CA (other replicas serve it).
    plan = decide(m, T0, [both, both])
    assert plan.issue_serving and not plan.rotate_ca
    after = apply(plan, m, T0)
    assert after.serving is not None
    assert cert(after.serving.cert_pem).issued_by(new_ca)
    assert bundle_fps(after) == [new_ca.fingerprint, old_ca.fingerprint]
    # With no webhook configuration to protect, nothing holds the switch back.
    assert cert_plan.trusted_everywhere([]) is None
    assert decide(m, T0, []).issue_serving


def test_a_serving_cert_that_no_longer_verifies_is_replaced_without_waiting() -> None:
    # Everything expired (the cluster was off for two years): nothing to protect.
    m = material(T0, T0)
    later = T0 + 2 * CA_VALIDITY
    plan = decide(m, later, [frozenset()])
    assert plan.rotate_ca and plan.issue_serving and plan.bundle == ()
    after = apply(plan, m, later)
    assert after.ca is not None and after.serving is not None
    assert cert(after.serving.cert_pem).issued_by(cert(after.ca.cert_pem))
    assert len(bundle_fps(after)) == 1


def test_old_ca_leaves_the_bundle_when_it_expires() -> None:
    old = material(T0, T0)
    old_ca = cert(old.bundle)
    expiry = old_ca.not_after
    # Rotated on day 200 (not due again by the old CA's expiry), and the serving
    # cert, on the new CA, renewed a day before that expiry: only the prune is due.
    new = tls.new_ca("new-ca", now=T0 + dt.timedelta(days=200), valid_for=CA_VALIDITY)
    renewed = expiry - dt.timedelta(days=1)
    serving = tls.issue(new, DNS[0], now=renewed, valid_for=CERT_VALIDITY, dns=DNS, ips=IPS)
    m = Material(new, serving, new.cert_pem + old.bundle)
    new_ca = cert(new.cert_pem)
    before = decide(m, expiry - SECOND)
    assert not before.changes
    assert [c.fingerprint for c in before.bundle] == [new_ca.fingerprint, old_ca.fingerprint]
    at = decide(m, expiry)
    assert at.prune and not at.rotate_ca and not at.issue_serving
    assert [c.fingerprint for c in at.bundle] == [new_ca.fingerprint]
    after = apply(at, m, expiry)
    assert bundle_fps(after) == [new_ca.fingerprint]
    assert after.ca == m.ca and after.serving == m.serving


def test_a_fresh_serving_cert_never_outlives_its_ca() -> None:
    m = material(T0, T0)
    ca = cert(m.bundle)
    late = ca.not_after - dt.timedelta(days=30)
    # A re-issue from the current CA 30 days before it expires (by hand: decide()
    # would rotate the CA first at this point).
    plan = Plan(rotate_ca=False, issue_serving=True, bundle=(ca,))
    after = apply(plan, m, late)
    assert after.serving is not None
    assert cert(after.serving.cert_pem).not_after == ca.not_after


def test_cabundle_patch_tests_each_webhook_name_before_writing() -> None:
    bundle = material(T0, T0).bundle
    b64 = base64.b64encode(bundle).decode()
    config = {
        "webhooks": [
            {"name": "a.sandman.dev", "clientConfig": {"url": "https://x"}},
            {"name": "b.sandman.dev", "clientConfig": {"url": "https://x", "caBundle": "Zm9v"}},
            {"name": "c.sandman.dev", "clientConfig": {"url": "https://x", "caBundle": b64}},
        ]
    }
    assert cert_plan.ca_bundle_patch(config, bundle) == [
        {"op": "test", "path": "/webhooks/0/name", "value": "a.sandman.dev"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": b64},
        {"op": "test", "path": "/webhooks/1/name", "value": "b.sandman.dev"},
        {"op": "replace", "path": "/webhooks/1/clientConfig/caBundle", "value": b64},
    ]
    fps = cert_plan.webhook_bundles(config)
    assert fps == [frozenset(), frozenset(), frozenset({cert(bundle).fingerprint})]
    in_sync = {"webhooks": [{"name": "c", "clientConfig": {"caBundle": b64}}]}
    assert cert_plan.ca_bundle_patch(in_sync, bundle) == []
