"""Access tokens and admission markers (design section 5), derived, never stored per sandbox.

    K          cluster key: 32 random bytes, one per generation (key id), in
               Secret sandman-system/sandman-cluster-key (current + previous
               during a rotation's overlap)
    K_ns     = HMAC-SHA256(K, "sandman.dev/namespace-key/v2" | name | uid)
               synced into Secret <ns>/sandman-access (per key id)
    token    = HMAC-SHA256(K_ns, sandbox id)  hex; what a client sends as Bearer
    daemon   gets only SHA-256(token)          an agent inside cannot invert it
    K_adm    = HMAC-SHA256(K, "sandman.dev/admission-marker/v1")
    marker   = HMAC-SHA256(K_adm, namespace | sandbox id | key id)
               annotation sandman.dev/admitted: only the webhook can write it,
               and the reaper (which holds every K_adm, never K) checks it

Deriving K_ns from the namespace's UID as well as its name means a namespace
deleted and re-created (by another team) gets a new key: tokens of the old
one's sandboxes mean nothing there. Anyone who may read ``sandman-access`` in
a namespace (its users) can compute the token of every sandbox there from the
pod's id label and key id alone; a sandbox holds neither K_ns nor a
service-account token, so it cannot compute another sandbox's token.

Rotation (docs/security.md): a new generation becomes current, the old one
stays "previous" for an overlap (sandboxes admitted before keep working, and
their users can still compute their tokens); when the overlap ends, the old
generation is retired: its K_ns leaves every ``sandman-access`` and the reaper
reclaims what is still running under it, so old tokens stop working.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

CLUSTER_KEY_SECRET = "sandman-cluster-key"
ACCESS_SECRET = "sandman-access"
ADMISSION_KEY_SECRET = "sandman-admission-key"  # the reaper's: every K_adm, never K
KEY_FIELD = "key"
KEY_ID_FIELD = "key-id"
PREVIOUS_FIELD = "previous"
PREVIOUS_ID_FIELD = "previous-id"
PREVIOUS_UNTIL_FIELD = "previous-until"
ADMISSION_KEYS_FIELD = "keys"  # JSON {key id: base64 K_adm}
RETIRED_FIELD = "retired"  # JSON [key id, ...]
CLUSTER_KEY_BYTES = 32  # HMAC-SHA256 key: 256 bits
ID_BYTES = 8  # 64-bit random sandbox ids: collisions are not a concern per namespace
KEY_ID_BYTES = 4  # 8 hex characters: generations are few; ids only tell them apart
# A cluster key Secret written before key ids existed holds generation "0";
# the webhook rotates it away on its first start (webhook/access.py).
LEGACY_KEY_ID = "0"
LEGACY_OVERLAP = dt.timedelta(hours=24)  # the built-in ttl.max: no older sandbox outlives it

_NS_LABEL = b"sandman.dev/namespace-key/v2"
_ADMISSION_LABEL = b"sandman.dev/admission-marker/v1"


class KeySecretError(ValueError):
    """A key Secret that cannot be read (the message says which field)."""


class KeyRetired(LookupError):
    """The sandbox was admitted under a key generation that is no longer published."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(value: Any, what: str) -> bytes:
    try:
        out = base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise KeySecretError(f"{what} is not base64") from None
    if not out:
        raise KeySecretError(f"{what} is empty")
    return out


def _text(data: Mapping[str, Any], name: str) -> str | None:
    """A Secret's ``data`` field holding text, or None."""
    value = data.get(name)
    return None if value is None else _unb64(value, name).decode()


def new_cluster_key() -> bytes:
    return secrets.token_bytes(CLUSTER_KEY_BYTES)


def new_key_id() -> str:
    return secrets.token_hex(KEY_ID_BYTES)


def new_sandbox_id() -> str:
    return secrets.token_hex(ID_BYTES)


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"\x00".join(parts), hashlib.sha256).digest()


def namespace_key(cluster_key: bytes, namespace: str, uid: str) -> bytes:
    """K_ns for the namespace named ``namespace`` with this ``uid``."""
    if not uid:
        raise ValueError(f"namespace {namespace!r}: no UID, so no key can be derived")
    return _mac(cluster_key, _NS_LABEL, namespace.encode(), uid.encode())


def generation_namespace_key(key_id: str, cluster_key: bytes, namespace: str, uid: str) -> bytes:
    """K_ns of one generation. Generation "0" (a cluster key from before key ids)
    keeps the first releases' name-only derivation, so that sandboxes admitted
    before an upgrade stay reachable through its overlap; every later one
    derives from the UID too."""
    if key_id == LEGACY_KEY_ID:
        return hmac.new(cluster_key, namespace.encode(), hashlib.sha256).digest()
    return namespace_key(cluster_key, namespace, uid)


def sandbox_token(ns_key: bytes, sandbox_id: str) -> str:
    return hmac.new(ns_key, sandbox_id.encode(), hashlib.sha256).hexdigest()


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def admission_key(cluster_key: bytes) -> bytes:
    return _mac(cluster_key, _ADMISSION_LABEL)


def admission_marker(adm_key: bytes, namespace: str, sandbox_id: str, key_id: str) -> str:
    return _mac(adm_key, namespace.encode(), sandbox_id.encode(), key_id.encode()).hex()


@dataclass(frozen=True)
class KeyRing:
    """The cluster key generations in use: what Secret sandman-cluster-key holds.

    Prevents the two failures of a rotation: sandboxes admitted under the old
    key becoming unreachable the moment it changes (the overlap keeps the old
    generation published), and old keys living forever (``expire`` retires it
    once the overlap ends). Immutable; safe to share.
    """

    current: bytes
    current_id: str
    previous: bytes | None = None
    previous_id: str | None = None
    previous_until: dt.datetime | None = None

    @classmethod
    def from_secret_data(cls, data: Mapping[str, Any]) -> KeyRing:
        if KEY_FIELD not in data:
            raise KeySecretError(f"the cluster key Secret has no {KEY_FIELD!r}")
        current = _unb64(data[KEY_FIELD], KEY_FIELD)
        prev = data.get(PREVIOUS_FIELD)
        until = _text(data, PREVIOUS_UNTIL_FIELD)
        try:
            until_t = dt.datetime.fromisoformat(until.replace("Z", "+00:00")) if until else None
        except ValueError:
            raise KeySecretError(f"{PREVIOUS_UNTIL_FIELD} is not a time") from None
        return cls(
            current=current,
            current_id=_text(data, KEY_ID_FIELD) or LEGACY_KEY_ID,
            previous=_unb64(prev, PREVIOUS_FIELD) if prev is not None else None,
            previous_id=_text(data, PREVIOUS_ID_FIELD) if prev is not None else None,
            previous_until=until_t if prev is not None else None,
        )

    def to_secret_data(self) -> dict[str, str]:
        data = {KEY_FIELD: _b64(self.current), KEY_ID_FIELD: _b64(self.current_id.encode())}
        if self.previous is not None and self.previous_id is not None:
            data[PREVIOUS_FIELD] = _b64(self.previous)
            data[PREVIOUS_ID_FIELD] = _b64(self.previous_id.encode())
            if self.previous_until is not None:
                until = self.previous_until.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                data[PREVIOUS_UNTIL_FIELD] = _b64(until.encode())
        return data

    def generations(self) -> dict[str, bytes]:
        """Key id -> K for every generation still published."""
        out = {self.current_id: self.current}
        if self.previous is not None and self.previous_id is not None:
            out[self.previous_id] = self.previous
        return out

    def rotated(self, now: dt.datetime, overlap: dt.timedelta) -> KeyRing:
        """A new current generation; this one stays published for ``overlap``."""
        if self.previous is not None:
            raise RotationInProgress(
                f"generation {self.previous_id} is still in its overlap (until "
                f"{self.previous_until}); wait for it to end, or finish it first"
            )
        new_id = new_key_id()
        while new_id in (self.current_id, LEGACY_KEY_ID):
            new_id = new_key_id()
        return KeyRing(
            current=new_cluster_key(),
            current_id=new_id,
            previous=self.current,
            previous_id=self.current_id,
            previous_until=now + overlap,
        )

    def expired(self, now: dt.datetime) -> KeyRing:
        """This ring once the overlap ended at ``now`` (itself when nothing ended)."""
        if self.previous is None:
            return self
        if self.previous_until is not None and now < self.previous_until:
            return self
        return replace(self, previous=None, previous_id=None, previous_until=None)

    def finished(self) -> KeyRing:
        """Ends the overlap now (``rotate-key --finish``)."""
        return replace(self, previous=None, previous_id=None, previous_until=None)


class RotationInProgress(RuntimeError):
    """A rotation was asked for while the previous one's overlap still runs."""


def access_secret_data(ring: KeyRing, namespace: str, uid: str) -> dict[str, str]:
    """What Secret <namespace>/sandman-access holds for this ring."""
    data = {
        KEY_FIELD: _b64(generation_namespace_key(ring.current_id, ring.current, namespace, uid)),
        KEY_ID_FIELD: _b64(ring.current_id.encode()),
    }
    if ring.previous is not None and ring.previous_id is not None:
        prev = generation_namespace_key(ring.previous_id, ring.previous, namespace, uid)
        data[PREVIOUS_FIELD] = _b64(prev)
        data[PREVIOUS_ID_FIELD] = _b64(ring.previous_id.encode())
    return data


@dataclass(frozen=True)
class AccessKeys:
    """A namespace's K_ns per key id, as its users read them from ``sandman-access``."""

    keys: dict[str, bytes]
    current_id: str

    @classmethod
    def from_secret_data(cls, data: Mapping[str, Any]) -> AccessKeys:
        if KEY_FIELD not in data:
            raise KeySecretError(f"{ACCESS_SECRET} has no {KEY_FIELD!r}")
        current_id = _text(data, KEY_ID_FIELD) or LEGACY_KEY_ID
        keys = {current_id: _unb64(data[KEY_FIELD], KEY_FIELD)}
        prev_id = _text(data, PREVIOUS_ID_FIELD)
        if prev_id is not None and PREVIOUS_FIELD in data:
            keys[prev_id] = _unb64(data[PREVIOUS_FIELD], PREVIOUS_FIELD)
        return cls(keys, current_id)

    def key_for(self, key_id: str | None) -> bytes:
        """K_ns for a sandbox admitted under ``key_id``. None (a pod without
        ``sandman.dev/key-id``, admitted before key ids) means generation "0"
        while it is published, else the current one."""
        kid = key_id or (LEGACY_KEY_ID if LEGACY_KEY_ID in self.keys else self.current_id)
        try:
            return self.keys[kid]
        except KeyError:
            raise KeyRetired(
                f"the sandbox was admitted under key generation {kid!r}, which is no longer "
                f"published (current: {self.current_id!r}); replace the sandbox"
            ) from None


@dataclass(frozen=True)
class AdmissionKeys:
    """What the reaper holds (Secret sandman-admission-key): K_adm of every
    generation ever used, and which generations are retired."""

    keys: dict[str, bytes] = field(default_factory=dict)
    retired: frozenset[str] = frozenset()

    @classmethod
    def from_secret_data(cls, data: Mapping[str, Any]) -> AdmissionKeys:
        try:
            keys = json.loads(_text(data, ADMISSION_KEYS_FIELD) or "{}")
            retired = json.loads(_text(data, RETIRED_FIELD) or "[]")
        except ValueError:
            raise KeySecretError(f"{ADMISSION_KEY_SECRET} does not hold JSON") from None
        if not isinstance(keys, dict) or not isinstance(retired, list):
            raise KeySecretError(f"{ADMISSION_KEY_SECRET}: unexpected shape")
        return cls(
            {str(k): _unb64(v, f"{ADMISSION_KEYS_FIELD}.{k}") for k, v in keys.items()},
            frozenset(str(r) for r in retired),
        )

    def to_secret_data(self) -> dict[str, str]:
        keys = {k: _b64(v) for k, v in sorted(self.keys.items())}
        return {
            ADMISSION_KEYS_FIELD: _b64(json.dumps(keys).encode()),
            RETIRED_FIELD: _b64(json.dumps(sorted(self.retired)).encode()),
        }

    def merged(self, ring: KeyRing) -> AdmissionKeys:
        """These keys plus the ring's generations; a generation that left the
        ring (its overlap ended) is retired."""
        keys = dict(self.keys)
        for kid, k in ring.generations().items():
            keys[kid] = admission_key(k)
        live = set(ring.generations())
        retired = set(self.retired) | {kid for kid in keys if kid not in live}
        return AdmissionKeys(keys, frozenset(retired - live))

    def verify(self, namespace: str, sandbox_id: str, key_id: str, marker: str) -> bool:
        k = self.keys.get(key_id)
        if k is None or not marker:
            return False
        want = admission_marker(k, namespace, sandbox_id, key_id)
        return hmac.compare_digest(want, marker)
