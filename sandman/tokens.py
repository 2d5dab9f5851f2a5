"""Access tokens (design section 5), derived, never stored per sandbox.

    K          cluster key: 32 random bytes in Secret sandman-system/sandman-cluster-key
    K_ns     = HMAC-SHA256(K, namespace)       synced into Secret <ns>/sandman-access
    token    = HMAC-SHA256(K_ns, sandbox id)   hex; what a client sends as Bearer
    daemon   gets only SHA-256(token)           an agent inside cannot invert it

Anyone who may read ``sandman-access`` in a namespace (its users) can compute
the token of every sandbox there from the pod's id label
alone; a sandbox holds neither K_ns nor any service-account token, so it
cannot compute another sandbox's token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

CLUSTER_KEY_SECRET = "sandman-cluster-key"
ACCESS_SECRET = "sandman-access"
KEY_FIELD = "key"
CLUSTER_KEY_BYTES = 32  # HMAC-SHA256 key: 256 bits
ID_BYTES = 8  # 64-bit random sandbox ids: collisions are not a concern per namespace


def new_cluster_key() -> bytes:
    return secrets.token_bytes(CLUSTER_KEY_BYTES)


def namespace_key(cluster_key: bytes, namespace: str) -> bytes:
    return hmac.new(cluster_key, namespace.encode(), hashlib.sha256).digest()


def sandbox_token(ns_key: bytes, sandbox_id: str) -> str:
    return hmac.new(ns_key, sandbox_id.encode(), hashlib.sha256).hexdigest()


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_sandbox_id() -> str:
    return secrets.token_hex(ID_BYTES)
