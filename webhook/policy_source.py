"""Where the policy comes from, and reloading it when it changes.

A mounted ConfigMap changes on disk without any filesystem event we could
rely on (kubelet swaps a symlink), so a file is re-read when its content hash
changes, polled; a ConfigMap named on the command line is watched through the
API instead, which applies an edit within a second. A policy that fails to
parse never replaces the last good one: a typo must not open the cluster.
Since `kubectl apply` of a bad policy succeeds, the outcome of each new text
is said where its author looks: an Event on the ConfigMap (`PolicyRejected`
with the parse error, or `PolicyLoaded`), besides the log and the metrics.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from enum import Enum
from pathlib import Path

from sandman.contract import REASON_POLICY_LOADED, REASON_POLICY_REJECTED
from sandman.events import ObjectRef
from sandman.informer import Informer
from sandman.kube_async import CONFIGMAPS, KubeClient, sleep_or
from sandman.webhook.policy import Policy, PolicyError, parse_policy_text

log = logging.getLogger("sandman.webhook")

POLICY_KEY = "policy.yaml"  # the ConfigMap key holding the policy
FILE_POLL_S = 2.0  # kubelet propagates ConfigMap edits in ~60 s anyway

# (object, reason, message, type): EventRecorder.emit's shape.
Report = Callable[[ObjectRef, str, str, str], None]


class Load(Enum):
    """What a text did to the policy in force."""

    LOADED = "loaded"  # now in force (new, or in force again after a rejected text)
    UNCHANGED = "unchanged"  # the text in force, or a rejected text already reported
    REJECTED = "rejected"  # failed to parse: the previous policy stays


class PolicySource:
    """Holds the current policy; reloads it. Event-loop only."""

    def __init__(self) -> None:
        self.policy = Policy(())
        self.loaded = asyncio.Event()
        self.errors = 0
        self.reloads = 0
        self.rejected: str | None = None  # why the latest text was refused, while it stands
        self._digest = ""
        self._rejected_digest = ""

    def current(self) -> Policy:
        return self.policy

    def load_text(self, text: str, origin: str) -> Load:
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest == self._digest:
            self.loaded.set()
            if self.rejected is None:
                return Load.UNCHANGED
            self.rejected, self._rejected_digest = None, ""
            self.reloads += 1  # the ConfigMap's text is in force again: a load to watchers
            log.info("policy from %s is the one in force again", origin)
            return Load.LOADED
        if digest == self._rejected_digest:
            return Load.UNCHANGED  # a re-list or the file poll: said once already
        try:
            policy = parse_policy_text(text)
        except PolicyError as e:
            self.errors += 1
            self.rejected, self._rejected_digest = str(e), digest
            log.error("policy from %s rejected, keeping the previous one: %s", origin, e)
            return Load.REJECTED
        self.policy, self._digest = policy, digest
        self.rejected, self._rejected_digest = None, ""
        self.reloads += 1
        self.loaded.set()
        log.info("policy loaded from %s: %d rule set(s)", origin, len(policy.rules))
        return Load.LOADED

    def event(self, outcome: Load) -> tuple[str, str, str]:
        """(reason, message, type) of the Event for ``outcome`` (LOADED or REJECTED)."""
        if outcome is Load.REJECTED:
            message = (
                f"policy rejected, the previous one stays in force: {self.rejected} "
                "(fix the ConfigMap; docs/policy.md has every field)"
            )
            return REASON_POLICY_REJECTED, message, "Warning"
        message = f"policy loaded: {len(self.policy.rules)} rule set(s) in force"
        return REASON_POLICY_LOADED, message, "Normal"

    async def watch_file(self, path: Path, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.load_text(path.read_text(), str(path))
            except OSError as e:
                self.errors += 1
                log.error("cannot read policy file %s: %s", path, e)
            await sleep_or(stop, FILE_POLL_S)

    async def watch_configmap(
        self, client: KubeClient, ref: str, stop: asyncio.Event, report: Report | None = None
    ) -> None:
        namespace, _, name = ref.partition("/")

        def on_event(kind: str, obj: dict) -> None:  # type: ignore[type-arg]
            if kind == "DELETED":
                log.error("policy ConfigMap %s deleted; keeping the last policy", ref)
                return
            text = (obj.get("data") or {}).get(POLICY_KEY, "")
            outcome = self.load_text(text, f"configmap {ref}")
            if report is not None and outcome is not Load.UNCHANGED:
                report(ObjectRef.of(obj, kind="ConfigMap"), *self.event(outcome))

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
