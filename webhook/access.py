"""Access keys: the cluster key, and each namespace's key published to it.

Kept out of the admission path (design section 5): admission only computes
HMACs from the cluster key held in memory; writing the per-namespace Secret
happens here, from a namespace informer, like kube-controller-manager's
publisher of kube-root-ca.crt. Every replica of the webhook may run this:
the content is a pure function of the cluster key, so concurrent writers
agree and a 409 from one of them is simply a no-op.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

from sandman import tokens
from sandman.kube_async import SECRETS, ApiError, KubeClient

log = logging.getLogger("sandman.webhook")

MANAGED_BY = {"app.kubernetes.io/managed-by": "sandman"}


def _secret(name: str, namespace: str, key: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "type": "Opaque",
        "data": {tokens.KEY_FIELD: base64.b64encode(key).decode()},
    }


async def load_or_create_cluster_key(client: KubeClient, namespace: str) -> bytes:
    """The cluster key K from its Secret, created on first start (race-safe)."""
    for _ in range(5):
        try:
            s = await client.get(SECRETS, tokens.CLUSTER_KEY_SECRET, namespace)
            return base64.b64decode(s["data"][tokens.KEY_FIELD])
        except ApiError as e:
            if not e.not_found:
                raise
        try:
            await client.create(
                SECRETS,
                _secret(tokens.CLUSTER_KEY_SECRET, namespace, tokens.new_cluster_key()),
                namespace,
            )
        except ApiError as e:
            if not e.conflict:  # another replica created it first: read theirs
                raise
    raise RuntimeError("could not read or create the cluster key Secret")


class AccessPublisher:
    """Keeps ``sandman-access`` (K_ns) in every sandbox namespace.

    Prevents the failure where a namespace's users cannot compute their
    sandboxes' tokens (no Secret) or compute wrong ones (a stale or edited
    Secret): each pass rewrites what differs. Event-loop only.
    """

    def __init__(self, client: KubeClient, cluster_key: bytes, excluded: set[str]) -> None:
        self.client = client
        self.cluster_key = cluster_key
        self.excluded = excluded
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.pending: set[str] = set()
        self.published = 0

    def on_namespace(self, kind: str, ns: dict[str, Any]) -> None:
        name = ns["metadata"]["name"]
        if kind == "DELETED" or name in self.excluded:
            return
        if (ns.get("status") or {}).get("phase") == "Terminating":
            return
        if name not in self.pending:
            self.pending.add(name)
            self.queue.put_nowait(name)

    async def ensure(self, namespace: str) -> None:
        want = base64.b64encode(tokens.namespace_key(self.cluster_key, namespace)).decode()
        try:
            s = await self.client.get(SECRETS, tokens.ACCESS_SECRET, namespace)
        except ApiError as e:
            if not e.not_found:
                raise
            try:
                await self.client.create(
                    SECRETS,
                    _secret(
                        tokens.ACCESS_SECRET,
                        namespace,
                        tokens.namespace_key(self.cluster_key, namespace),
                    ),
                    namespace,
                )
                self.published += 1
            except ApiError as e2:
                if not (e2.conflict or e2.status == 403):  # 403: namespace terminating
                    raise
            return
        if (s.get("data") or {}).get(tokens.KEY_FIELD) != want:
            s["data"] = {tokens.KEY_FIELD: want}
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
                self.on_namespace("MODIFIED", {"metadata": {"name": ns}})
