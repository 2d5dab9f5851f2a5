"""X.509 helpers on `cryptography`: a CA and the certificates it signs.

Shared by the local cluster's PKI and by components that manage their own TLS
(the webhook), so that key type, validity and extensions are decided once.
ECDSA P-256 keys: generating one takes well under a millisecond, against tens of
milliseconds for RSA-2048, and every Kubernetes component accepts them.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def private_key(self) -> PrivateKeyTypes:
        return serialization.load_pem_private_key(self.key_pem, password=None)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(cn: str, orgs: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def new_ca(cn: str, *, now: dt.datetime, valid_for: dt.timedelta) -> KeyPair:
    key = _new_key()
    name = _name(cn)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # Back-date by a minute: other processes' clocks may lag ours slightly.
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(
    ca: KeyPair,
    cn: str,
    *,
    now: dt.datetime,
    valid_for: dt.timedelta,
    orgs: Sequence[str] = (),
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    server: bool = False,
    client: bool = False,
) -> KeyPair:
    key = _new_key()
    ca_cert = ca.cert
    ca_key = ca.private_key()
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn, orgs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + valid_for)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def new_signing_key() -> tuple[bytes, bytes]:
    """A key pair for service-account token signing (private PEM, public PEM)."""
    key = _new_key()
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _key_pem(key), pub
