"""What the webhook's TLS needs next, given the Secret's contents, the time and the caBundles.

No I/O and no clock: the caller reads the Secret and the webhook configurations,
passes ``now``, and writes back what :func:`apply` returns. ``CertManager``
(``certs.py``) is that caller.

The Secret holds ``ca.crt``/``ca.key`` (the CA that signs new serving certs),
``tls.crt``/``tls.key`` (the serving cert every replica loads) and
``ca-bundle.crt`` (every CA still trusted, current first): the value every
``webhooks[*].clientConfig.caBundle`` is kept equal to.

Ordering contract, the reason this module exists: a serving cert signed by a new
CA MUST NOT be issued while any webhook's caBundle lacks that CA, and the old CA
MUST stay in the bundle until it expires. The race it prevents: the CA rotates,
a replica loads a cert from the new CA, and an apiserver still holding the old
caBundle fails TLS on every admission call (a cluster-wide outage under
``failurePolicy: Fail``) until the bundle catches up. A caBundle holding the CA
in etcd is not yet every apiserver holding it (each sees the change through its
own watch), so the caller passes as ``trusted`` only the CAs that every caBundle
has held for a settling time (``certs.CABUNDLE_SETTLE``).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization

from sandman import tls

CA_CRT, CA_KEY, TLS_CRT, TLS_KEY, BUNDLE = "ca.crt", "ca.key", "tls.crt", "tls.key", "ca-bundle.crt"


@dataclass(frozen=True)
class Cert:
    """The facts about one parsed certificate that the decisions need."""

    pem: bytes
    not_before: dt.datetime
    not_after: dt.datetime
    fingerprint: str  # SHA-256 of the DER: how CAs are told apart (they share a subject)
    sans: frozenset[str]
    cert: x509.Certificate = field(compare=False, repr=False)

    @classmethod
    def parse(cls, pem: bytes) -> Cert:
        return cls.from_x509(x509.load_pem_x509_certificate(pem))

    @classmethod
    def from_x509(cls, c: x509.Certificate) -> Cert:
        try:
            ext = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            sans = frozenset(
                [*ext.get_values_for_type(x509.DNSName)]
                + [str(i) for i in ext.get_values_for_type(x509.IPAddress)]
            )
        except x509.ExtensionNotFound:
            sans = frozenset()
        return cls(
            pem=c.public_bytes(serialization.Encoding.PEM),
            not_before=c.not_valid_before_utc,
            not_after=c.not_valid_after_utc,
            fingerprint=c.fingerprint(hashes.SHA256()).hex(),
            sans=sans,
            cert=c,
        )

    def renew_at(self, renew_fraction: float) -> dt.datetime:
        """The instant from which less than ``renew_fraction`` of the lifetime is left."""
        return self.not_after - (self.not_after - self.not_before) * renew_fraction

    def issued_by(self, ca: Cert) -> bool:
        try:
            self.cert.verify_directly_issued_by(ca.cert)
        except (ValueError, TypeError, InvalidSignature):
            return False
        return True


def parse_bundle(pem: bytes) -> tuple[Cert, ...]:
    """Every certificate of a PEM bundle; an unreadable bundle trusts nothing."""
    try:
        return tuple(Cert.from_x509(c) for c in x509.load_pem_x509_certificates(pem))
    except ValueError:
        return ()


@dataclass(frozen=True)
class Material:
    """The Secret's contents. Key bytes live here only for the length of one pass."""

    ca: tls.KeyPair | None = None
    serving: tls.KeyPair | None = None
    bundle: bytes = b""

    @classmethod
    def from_secret_data(cls, data: Mapping[str, str] | None) -> Material:
        raw = {k: _b64(v) for k, v in (data or {}).items()}
        ca = tls.KeyPair(raw[CA_CRT], raw[CA_KEY]) if raw.get(CA_CRT) and raw.get(CA_KEY) else None
        srv = raw.get(TLS_CRT) and raw.get(TLS_KEY)
        serving = tls.KeyPair(raw[TLS_CRT], raw[TLS_KEY]) if srv else None
        return cls(ca, serving, raw.get(BUNDLE, b""))

    def secret_data(self) -> dict[str, str]:
        assert self.ca is not None and self.serving is not None
        raw = {
            CA_CRT: self.ca.cert_pem,
            CA_KEY: self.ca.key_pem,
            TLS_CRT: self.serving.cert_pem,
            TLS_KEY: self.serving.key_pem,
            BUNDLE: self.bundle,
        }
        return {k: base64.b64encode(v).decode() for k, v in raw.items()}


def _b64(v: str) -> bytes:
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        return b""


def _parse(pem: bytes | None) -> Cert | None:
    try:
        return Cert.parse(pem) if pem else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Plan:
    """One pass's decision. ``bundle`` is what stays trusted, before a new CA is added."""

    rotate_ca: bool
    issue_serving: bool
    bundle: tuple[Cert, ...]
    reasons: tuple[str, ...] = ()
    waiting: str | None = None  # why a wanted re-issue is held back
    prune: bool = False  # the stored bundle differs from ``bundle`` (an expired CA leaves)

    @property
    def changes(self) -> bool:
        return self.rotate_ca or self.issue_serving or self.prune


def decide(
    m: Material,
    *,
    now: dt.datetime,
    renew_fraction: float,
    sans: frozenset[str],
    trusted: frozenset[str] | None,
    force_ca_rotation: bool = False,
) -> Plan:
    """What to do now. ``trusted``: fingerprints of the CAs every webhook's caBundle has
    held long enough for every apiserver to have seen them (None: no webhook to wait for)."""
    ca = _parse(m.ca.cert_pem) if m.ca else None
    serving = _parse(m.serving.cert_pem) if m.serving else None
    reasons: list[str] = []
    rotate = True
    if ca is None:
        reasons.append("no usable CA")
    elif now >= ca.renew_at(renew_fraction):
        reasons.append(f"CA past its renewal point (expires {ca.not_after.isoformat()})")
    elif force_ca_rotation:
        reasons.append("CA rotation forced")
    else:
        rotate = False
    # Every CA still valid stays trusted (the overlap); expired ones are dropped.
    kept = [c for c in (ca, *parse_bundle(m.bundle)) if c is not None and now < c.not_after]
    bundle = tuple({c.fingerprint: c for c in kept}.values())
    prune = [c.fingerprint for c in parse_bundle(m.bundle)] != [c.fingerprint for c in bundle]
    if prune and not rotate:
        reasons.append("the stored CA bundle is not the set of valid CAs")

    want: list[str] = []
    switching = rotate or (serving is not None and ca is not None and not serving.issued_by(ca))
    if serving is None:
        want.append("no usable serving cert")
    else:
        if now >= serving.renew_at(renew_fraction):
            want.append(f"serving cert past its renewal point (expires {serving.not_after})")
        if serving.sans != sans:
            want.append("serving cert names differ from the configured ones")
        if switching:
            want.append("serving cert not signed by the current CA")
    if not want:
        return Plan(rotate, False, bundle, tuple(reasons), prune=prune)
    # A serving cert that verifies today against the bundle is worth keeping until
    # the new CA is trusted everywhere; a broken one is not (nothing to protect).
    working = (
        serving is not None
        and now < serving.not_after
        and any(serving.issued_by(c) for c in bundle)
    )
    may_switch = not rotate and ca is not None and (trusted is None or ca.fingerprint in trusted)
    if switching and working and not may_switch:
        wait = "; ".join(want) + ": held until every caBundle holds the new CA"
        return Plan(rotate, False, bundle, tuple(reasons), wait, prune)
    return Plan(rotate, True, bundle, (*reasons, *want), prune=prune)


def apply(
    plan: Plan,
    m: Material,
    *,
    now: dt.datetime,
    ca_validity: dt.timedelta,
    cert_validity: dt.timedelta,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str],
) -> Material:
    """The Material after ``plan``: new keys are generated here, nothing is written."""
    ca = m.ca
    if plan.rotate_ca or ca is None:
        # client-go's self-signed CAs are named "<host>-ca@<unix time>"; so are ours,
        # which tells rotated CAs apart in `openssl x509 -text` output.
        ca = tls.new_ca(
            f"sandman-webhook-ca@{int(now.timestamp())}", now=now, valid_for=ca_validity
        )
    ca_cert = Cert.parse(ca.cert_pem)
    serving = m.serving
    if plan.issue_serving or serving is None:
        # Never outlive the signer: a cert past its CA's expiry cannot verify.
        valid_for = min(cert_validity, ca_cert.not_after - now)
        cn = (*dns_names, *ip_addresses)[0]
        serving = tls.issue(
            ca, cn, now=now, valid_for=valid_for, dns=dns_names, ips=ip_addresses, server=True
        )
    others = [c for c in plan.bundle if c.fingerprint != ca_cert.fingerprint]
    bundle = b"".join(c.pem for c in (ca_cert, *others))
    return Material(ca, serving, bundle)


def webhook_bundles(config: Mapping[str, Any]) -> list[frozenset[str]]:
    """The CA fingerprints each webhook of a configuration trusts."""
    out = []
    for wh in config.get("webhooks") or []:
        b64 = (wh.get("clientConfig") or {}).get("caBundle") or ""
        out.append(frozenset(c.fingerprint for c in parse_bundle(_b64(b64))))
    return out


def trusted_everywhere(bundles: Sequence[frozenset[str]]) -> frozenset[str] | None:
    """The CAs every webhook trusts (``webhook_bundles`` of each configuration, joined);
    None when there is no webhook at all, so nothing to wait for."""
    return frozenset.intersection(*bundles) if bundles else None


def ca_bundle_patch(config: Mapping[str, Any], bundle: bytes) -> list[dict[str, Any]]:
    """A JSON patch setting every webhook's caBundle to ``bundle`` ([] if all equal).

    Each write is guarded by a ``test`` of the webhook's name at that index, so a
    concurrent edit that reorders the list fails the patch instead of writing
    the bundle into the wrong webhook.
    """
    want = base64.b64encode(bundle).decode()
    ops: list[dict[str, Any]] = []
    for i, wh in enumerate(config.get("webhooks") or []):
        cc = wh.get("clientConfig") or {}
        if cc.get("caBundle") == want:
            continue
        ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": wh["name"]})
        op = "replace" if "caBundle" in cc else "add"
        ops.append({"op": op, "path": f"/webhooks/{i}/clientConfig/caBundle", "value": want})
    return ops
