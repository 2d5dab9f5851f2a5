"""Where the policy comes from, and reloading it when it changes.

A mounted ConfigMap changes on disk without any filesystem event we could
rely on (kubelet swaps a symlink), so a file is re-read when its content hash
changes, polled; a ConfigMap named on the command line is watched through the
API instead, which applies an edit within a second. A policy that fails to
parse never replaces the last good one: a typo must not open the cluster.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path

from sandman.informer import Informer
from sandman.kube_async import CONFIGMAPS, KubeClient, sleep_or
from sandman.webhook.policy import Policy, PolicyError, parse_policy_text

log = logging.getLogger("sandman.webhook")

POLICY_KEY = "policy.yaml"  # the ConfigMap key holding the policy
FILE_POLL_S = 2.0  # kubelet propagates ConfigMap edits in ~60 s anyway


class PolicySource:
    """Holds the current policy; reloads it. Event-loop only."""

    def __init__(self) -> None:
        self.policy = Policy(())
        self.loaded = asyncio.Event()
        self.errors = 0
        self.reloads = 0
        self._digest = ""

    def current(self) -> Policy:
        return self.policy

    def load_text(self, text: str, origin: str) -> bool:
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest == self._digest:
            self.loaded.set()
            return False
        try:
            policy = parse_policy_text(text)
        except PolicyError as e:
            self.errors += 1
            log.error("policy from %s rejected, keeping the previous one: %s", origin, e)
            return False
        self.policy, self._digest = policy, digest
        self.reloads += 1
        self.loaded.set()
        log.info("policy loaded from %s: %d rule set(s)", origin, len(policy.rules))
        return True

    async def watch_file(self, path: Path, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.load_text(path.read_text(), str(path))
            except OSError as e:
                self.errors += 1
                log.error("cannot read policy file %s: %s", path, e)
            await sleep_or(stop, FILE_POLL_S)

    async def watch_configmap(self, client: KubeClient, ref: str, stop: asyncio.Event) -> None:
        namespace, _, name = ref.partition("/")

        def on_event(kind: str, obj: dict) -> None:  # type: ignore[type-arg]
            if kind == "DELETED":
                log.error("policy ConfigMap %s deleted; keeping the last policy", ref)
                return
            self.load_text((obj.get("data") or {}).get(POLICY_KEY, ""), f"configmap {ref}")

        informer = Informer(
            client,
            CONFIGMAPS,
            on_event,
            namespace=namespace,
            field_selector=f"metadata.name={name}",
        )
        task = asyncio.ensure_future(informer.run(stop))
        await informer.synced.wait()
        if not informer.store:
            log.warning("policy ConfigMap %s not found; using built-in defaults", ref)
            self.loaded.set()
        await task
