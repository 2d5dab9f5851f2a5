"""Pre-pull the next problems' images onto the nodes the extender would choose.

A warm pool hides a pull by starting whole sandboxes early; a pre-pull hides
only the pull, for the price of one short pod per image: no daemon, no slot,
no memory held. The fleet asks for the images of the ``ahead`` problems that
come after the warm ones (``choose_problems``), and for each image no node
holds or is pulling (the extender's ``GET /v1/images``: ``choose_images``)
creates one pod that runs ``true`` in that image through sandman-scheduler.
The extender places it as it would place a sandbox of that image (the
tie-break spreads new images over nodes), the node pulls, the index records
the node as a holder, and the problem's sandboxes then score 10 there and
land on it. The pod is deleted once its container has started.

Decisions are pure (the two ``choose_*`` functions); ``Prepuller`` is glue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from sandman.contract import LABEL_RUN, SCHEDULER_NAME
from sandman.fleet import strategies
from sandman.kube_async import PODS, ApiError, KubeClient

log = logging.getLogger(__name__)

# How often a pre-pull pod is looked at until its container started. A pull
# worth hiding takes seconds; a second of lag leaves the pod around a second
# longer (on kwok it holds nothing), for at most one GET per pod per second.
POLL_S = 1.0
# A pre-pull pod ends by itself after this (activeDeadlineSeconds): a 3 GB
# image at 10 MB/s takes 300 s; longer means the pull is not going to help.
DEADLINE_S = 600
# The extender's answer arrives in milliseconds; without one we pre-pull
# anyway (one wasted pod at worst), so do not wait long for it.
WHERE_TIMEOUT_S = 2.0


def choose_problems(
    strategy: str, window: int, remaining: Sequence[int], started: Sequence[bool], ahead: int
) -> list[int]:
    """The ``ahead`` open problems after the warm ones that no rollout has started.

    Warm problems pull through their pool pods; a started problem's pods are
    pulling already. For ``none`` nothing is warm, so these are simply the
    next ``ahead`` problems not yet begun.
    """
    if ahead <= 0:
        return []
    warm = set(strategies.warm_problems(strategy, window, remaining))
    out = []
    for i, n in enumerate(remaining):
        if n > 0 and i not in warm and not started[i]:
            out.append(i)
            if len(out) == ahead:
                break
    return out


@dataclass(frozen=True)
class Where:
    """The part of a ``/v1/images`` answer a pre-pull needs."""

    holders: int
    pulling: int

    @classmethod
    def from_answer(cls, doc: Mapping[str, Any]) -> Where:
        return cls(len(doc.get("holders") or []), len(doc.get("pulling") or []))

    @staticmethod
    def url(extender_url: str, image: str) -> str:
        """Where the extender answers for ``image``."""
        return f"{extender_url.rstrip('/')}/v1/images?{urllib.parse.urlencode({'image': image})}"


def choose_images(
    images: Sequence[str], where: Mapping[str, Where | None], asked: Collection[str]
) -> list[str]:
    """Images to pre-pull: each once, not asked before, and held or pulled by no node.

    No answer from the extender (``None``) counts as "nobody has it": a
    needless pre-pull costs one short pod, a missed one a full pull.
    """
    out = []
    for image in dict.fromkeys(images):
        if image in asked:
            continue
        w = where.get(image)
        if w is not None and (w.holders or w.pulling):
            continue
        out.append(image)
    return out


def prepull_pod(
    image: str,
    run_id: str,
    *,
    scheduler_name: str = SCHEDULER_NAME,
    command: Sequence[str] = ("true",),
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A plain pod (not a sandbox: no daemon, no webhook) that makes its node pull ``image``."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "restartPolicy": "Never",
        "activeDeadlineSeconds": DEADLINE_S,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "pull", "image": image, "command": list(command)}],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": f"prepull-{run_id}-", "labels": {LABEL_RUN: run_id}},
        "spec": spec,
    }


# Waiting reasons the kubelet gives only once the image is on the node (the
# container could not be made or run, e.g. an image without ``true``).
_PULLED_BUT_STUCK = ("CreateContainerError", "CreateContainerConfigError", "RunContainerError")


def started(pod: Mapping[str, Any]) -> bool:
    """The node has the image: its container ran, could not be made from the
    pulled image, or the pod ended either way."""
    st = pod.get("status") or {}
    if st.get("phase") in ("Running", "Succeeded", "Failed"):
        return True
    for c in st.get("containerStatuses") or []:
        state = c.get("state") or {}
        if "running" in state or "terminated" in state:
            return True
        if (state.get("waiting") or {}).get("reason") in _PULLED_BUT_STUCK:
            return True
    return False


class Prepuller:
    """Pre-pull pods of one fleet run. Event-loop only.

    Failure it guards against: pre-pull pods outliving the run (each is
    deleted once started, and ``close`` deletes every one it made) and
    pre-pulls starving rollouts of the create budget (``take_token`` is the
    pool manager's refill token: never ahead of an on-demand create).
    """

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        run_id: str,
        *,
        take_token: Callable[[], bool],
        extender_url: str | None = None,
        pod_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.kube, self.namespace, self.run_id = kube, namespace, run_id
        self.take_token = take_token
        self.extender_url = extender_url.rstrip("/") if extender_url else None
        self.pod_options = dict(pod_options or {})
        self.asked: set[str] = set()
        self.pods: dict[str, bool] = {}  # name -> deleted
        self.created = 0
        self.skipped = 0  # the extender said a node holds or pulls it already
        self._tasks: set[asyncio.Task[None]] = set()
        self._http: aiohttp.ClientSession | None = None

    def want(self, images: Sequence[str]) -> None:
        """Start pre-pulls for these images (each image once per run)."""
        for image in dict.fromkeys(images):
            if image in self.asked:
                continue
            self.asked.add(image)
            t = asyncio.create_task(self._one(image))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _where(self, image: str) -> Where | None:
        if self.extender_url is None:
            return None
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WHERE_TIMEOUT_S))
        url = Where.url(self.extender_url, image)
        try:
            async with self._http.get(url) as resp:
                if resp.status != 200:
                    return None
                return Where.from_answer(await resp.json())
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            log.warning("extender %s: %s (pre-pulling %s anyway)", self.extender_url, e, image)
            return None

    async def _one(self, image: str) -> None:
        try:
            if not choose_images([image], {image: await self._where(image)}, ()):
                self.skipped += 1
                return
            while not self.take_token():
                await asyncio.sleep(0.05)
            body = prepull_pod(image, self.run_id, **self.pod_options)
            pod = await self.kube.create(PODS, body, self.namespace)
            name = pod["metadata"]["name"]
            self.pods[name] = False
            self.created += 1
            while not started(pod):
                await asyncio.sleep(POLL_S)
                pod = await self.kube.get(PODS, name, self.namespace)
            await self._delete(name)
        except (ApiError, OSError, TimeoutError, aiohttp.ClientError) as e:
            log.warning("pre-pull of %s: %s", image, e)

    async def _delete(self, name: str) -> None:
        if self.pods.get(name):
            return
        self.pods[name] = True
        try:
            await self.kube.delete(PODS, name, self.namespace, grace_period_s=0)
        except ApiError as e:
            if not e.not_found:
                self.pods[name] = False
                log.warning("pre-pull pod %s not deleted: %s", name, e)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for name, deleted in list(self.pods.items()):
            if not deleted:
                await self._delete(name)
        if self._http is not None:
            await self._http.close()
