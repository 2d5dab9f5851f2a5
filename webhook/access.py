"""Keys: the cluster key ring, each namespace's access key, the reaper's admission keys.

Kept out of the admission path (design section 5): admission only computes
HMACs from the ring held in memory; writing Secrets happens here, from a
namespace informer and a poll of the cluster key Secret, like
kube-controller-manager's publisher of kube-root-ca.crt. Every replica of
the webhook may run this: each Secret's content is a pure function of the
ring (and the namespace), so concurrent writers agree, and a 409 from one of
them is a no-op. The derivations and the rotation rule are in
``sandman.tokens``; docs/security.md has the admin's procedure.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from sandman import tokens
from sandman.clock import utc_now
from sandman.contract import ANN_ADMITTED, ANN_KEY_ID
from sandman.kube_async import SECRETS, ApiError, KubeClient, sleep_or
from sandman.tokens import AdmissionKeys, KeyRing

log = logging.getLogger("sandman.webhook")

MANAGED_BY = {"app.kubernetes.io/managed-by": "sandman"}
# A rotation made with `sandman webhook rotate-key` reaches every replica
# within this; admission keeps using the previous generation meanwhile, which
# the overlap covers. A GET per period per replica.
KEY_POLL_S = 10.0


def _secret(name: str, namespace: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "type": "Opaque",
        "data": data,
    }


async def load_or_create_ring(client: KubeClient, namespace: str) -> KeyRing:
    """The cluster key ring from its Secret, created on first start (race-safe)."""
    for _ in range(5):
        try:
            s = await client.get(SECRETS, tokens.CLUSTER_KEY_SECRET, namespace)
            ring = KeyRing.from_secret_data(s.get("data") or {})
            if ring.current_id != tokens.LEGACY_KEY_ID or ring.previous is not None:
                return ring
            # A cluster key from before key ids: its namespace keys derive from
            # names alone. Rotate it away at once; sandboxes admitted under it
            # stay reachable through the overlap.
            ring = ring.rotated(utc_now(), tokens.LEGACY_OVERLAP)
            s["data"] = ring.to_secret_data()
            try:
                await client.replace(SECRETS, tokens.CLUSTER_KEY_SECRET, s, namespace)
                log.info("pre-key-id cluster key rotated to generation %s", ring.current_id)
                return ring
            except ApiError as e:
                if not e.conflict:
                    raise
                continue  # another replica rotated it first: read theirs
        except ApiError as e:
            if not e.not_found:
                raise
        ring = KeyRing(tokens.new_cluster_key(), tokens.new_key_id())
        try:
            await client.create(
                SECRETS,
                _secret(tokens.CLUSTER_KEY_SECRET, namespace, ring.to_secret_data()),
                namespace,
            )
        except ApiError as e:
            if not e.conflict:  # another replica created it first: read theirs
                raise
    raise RuntimeError("could not read or create the cluster key Secret")


async def rotate(
    client: KubeClient,
    namespace: str,
    *,
    now: dt.datetime,
    overlap: dt.timedelta,
    finish: bool = False,
) -> KeyRing:
    """A new cluster key generation (or, with ``finish``, the end of the overlap
    now). Conditional on the Secret's resourceVersion: a concurrent change
    fails with 409 rather than being overwritten."""
    s = await client.get(SECRETS, tokens.CLUSTER_KEY_SECRET, namespace)
    ring = KeyRing.from_secret_data(s.get("data") or {}).expired(now)
    ring = ring.finished() if finish else ring.rotated(now, overlap)
    s["data"] = ring.to_secret_data()
    await client.replace(SECRETS, tokens.CLUSTER_KEY_SECRET, s, namespace)
    return ring


def marks_for(ring: KeyRing, namespace: str, sandbox_id: str) -> dict[str, str]:
    """The annotations only the webhook can write: the admission marker, the key id."""
    adm = tokens.admission_key(ring.current)
    return {
        ANN_ADMITTED: tokens.admission_marker(adm, namespace, sandbox_id, ring.current_id),
        ANN_KEY_ID: ring.current_id,
    }


def token_hash_for(ring: KeyRing, namespace: str, uid: str, sandbox_id: str) -> str:
    ns_key = tokens.namespace_key(ring.current, namespace, uid)
    return tokens.token_sha256(tokens.sandbox_token(ns_key, sandbox_id))


class KeyKeeper:
    """Holds the current ring; follows rotations; ends overlaps; keeps the reaper's keys.

    Prevents the failures of a rotation: replicas signing with different
    generations for long (each polls the Secret), an overlap that never ends
    (whichever replica sees it expire writes the shorter ring, conditionally),
    and the reaper unable to verify markers of a new (or an old) generation
    (Secret sandman-admission-key gets every generation's K_adm, and the
    retired ones listed). Event-loop only.
    """

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        ring: KeyRing,
        clock: Callable[[], dt.datetime] = utc_now,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.ring = ring
        self.clock = clock
        self._listeners: list[Callable[[KeyRing], None]] = []

    def on_change(self, listener: Callable[[KeyRing], None]) -> None:
        self._listeners.append(listener)

    async def reconcile(self) -> None:
        s = await self.client.get(SECRETS, tokens.CLUSTER_KEY_SECRET, self.namespace)
        ring = KeyRing.from_secret_data(s.get("data") or {})
        expired = ring.expired(self.clock())
        if expired != ring:
            s["data"] = expired.to_secret_data()
            try:
                await self.client.replace(SECRETS, tokens.CLUSTER_KEY_SECRET, s, self.namespace)
                log.info("key generation %s retired (its overlap ended)", ring.previous_id)
            except ApiError as e:
                if not e.conflict:
                    raise
                return  # changed meanwhile (another replica, a rotation): next pass
            ring = expired
        await self._ensure_admission_keys(ring)
        if ring != self.ring:
            self.ring = ring
            for listener in self._listeners:
                listener(ring)

    async def _ensure_admission_keys(self, ring: KeyRing) -> None:
        name = tokens.ADMISSION_KEY_SECRET
        try:
            s = await self.client.get(SECRETS, name, self.namespace)
        except ApiError as e:
            if not e.not_found:
                raise
            data = AdmissionKeys().merged(ring).to_secret_data()
            try:
                await self.client.create(
                    SECRETS, _secret(name, self.namespace, data), self.namespace
                )
            except ApiError as e2:
                if not e2.conflict:
                    raise
            return
        have = AdmissionKeys.from_secret_data(s.get("data") or {})
        want = have.merged(ring)
        if want != have:
            s["data"] = want.to_secret_data()
            await self.client.replace(SECRETS, name, s, self.namespace)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.reconcile()
            except (ApiError, OSError, TimeoutError, tokens.KeySecretError) as e:
                log.warning("cluster key not reconciled (%s); retrying", e)
            await sleep_or(stop, KEY_POLL_S)


class AccessPublisher:
    """Keeps ``sandman-access`` (K_ns per live generation) in every sandbox namespace.

    Prevents the failure where a namespace's users cannot compute their
    sandboxes' tokens (no Secret) or compute wrong ones (a stale or edited
    Secret, a rotation): each pass rewrites what differs, and a new ring
    queues every namespace again. Event-loop only.
    """

    def __init__(self, client: KubeClient, keeper: KeyKeeper, excluded: set[str]) -> None:
        self.client = client
        self.keeper = keeper
        self.excluded = excluded
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.pending: set[str] = set()
        self.uids: dict[str, str] = {}
        self.published = 0
        keeper.on_change(lambda _ring: self.republish())

    def on_namespace(self, kind: str, ns: dict[str, Any]) -> None:
        md = ns["metadata"]
        name = md["name"]
        if kind == "DELETED":
            self.uids.pop(name, None)
            return
        if name in self.excluded or (ns.get("status") or {}).get("phase") == "Terminating":
            return
        self.uids[name] = md.get("uid", "")
        self._enqueue(name)

    def republish(self) -> None:
        for name in list(self.uids):
            self._enqueue(name)

    def _enqueue(self, name: str) -> None:
        if name not in self.pending:
            self.pending.add(name)
            self.queue.put_nowait(name)

    async def ensure(self, namespace: str) -> None:
        uid = self.uids.get(namespace)
        if not uid:
            return  # deleted meanwhile
        want = tokens.access_secret_data(self.keeper.ring, namespace, uid)
        try:
            s = await self.client.get(SECRETS, tokens.ACCESS_SECRET, namespace)
        except ApiError as e:
            if not e.not_found:
                raise
            try:
                await self.client.create(
                    SECRETS, _secret(tokens.ACCESS_SECRET, namespace, want), namespace
                )
                self.published += 1
            except ApiError as e2:
                if not (e2.conflict or e2.status == 403):  # 403: namespace terminating
                    raise
            return
        if (s.get("data") or {}) != want:
            s["data"] = want
            await self.client.replace(SECRETS, tokens.ACCESS_SECRET, s, namespace)
            self.published += 1

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                ns = await asyncio.wait_for(self.queue.get(), 0.5)
            except TimeoutError:
                continue
            self.pending.discard(ns)
            try:
                await self.ensure(ns)
            except (ApiError, OSError, TimeoutError) as e:
                log.warning("access Secret for %s not written (%s); retrying", ns, e)
                await asyncio.sleep(1)
                self._enqueue(ns)
