"""Simulated nodes that pull images: a pod's Ready waits for its modeled pull.

Three parts:

- a kwok **Stage** (``pod-ready-after-pull``, kwok v0.7 Stage API): a pod
  becomes Ready at the time its annotation ``pull.stage.kwok.x-k8s.io/ready-at``
  names (an RFC 3339 time: kwok's ``delay.durationFrom`` turns a time into
  "that instant minus now"), and not before it has the annotation;
- the **simulator** (``PullSimulator``): watches the pods bound to these
  nodes and writes that annotation from ``pullmodel.PullModel`` (size / rate
  when the node does not hold the image, 0 when it does, the rest of a pull
  in progress when another pod started it);
- a **second kwok process** that manages only the nodes annotated
  ``kwok.x-k8s.io/node=pull`` with those Stages (``PullNodes``). The
  cluster's own kwok keeps the default Stages for its ``=fake`` nodes, so a
  cluster that does not ask for pull-modelled nodes behaves as before: a
  Stage that waits for an annotation would leave every other kwok pod
  Pending if no simulator ran.

Everything here is for tests and benchmarks on the local cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from sandman.harness.cluster.components import KWOK_NODE_ANNOTATION
from sandman.harness.cluster.config import KwokNodeShape
from sandman.harness.cluster.kwok_nodes import is_ready, kwok_node
from sandman.harness.cluster.process import ManagedProcess
from sandman.harness.cluster.pullmodel import PullModel
from sandman.kube_async import MERGE_PATCH, NODES, PODS, ApiError, KubeClient, WatchExpired

log = logging.getLogger(__name__)

PULL_NODE_VALUE = "pull"  # kwok.x-k8s.io/node=pull: managed by the pull-modelling kwok
READY_AT = "pull.stage.kwok.x-k8s.io/ready-at"  # RFC 3339 time the pod may be Ready
PULL_MS = "pull.stage.kwok.x-k8s.io/wait-ms"  # what the model made it wait (for reports)
# Pod IPs of the second kwok: next to the cluster kwok's 10.160.0.0/12, inside
# 10/8 like every range of the local cluster, clear of services (10.96/12)
# and the real node's pods (10.244/16).
PULL_POD_CIDR = "10.176.0.0/12"
WallClock = Callable[[], float]  # epoch seconds

# kwok v0.7's pod-ready Stage (kustomize/stage/pod/fast/pod-ready.yaml), with
# one more selector term and a delay until the simulator's time.
_POD_READY_STATUS = """\
{{ $now := Now }}

conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
{{ range .spec.readinessGates }}
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: {{ .conditionType | Quote }}
{{ end }}

containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}

initContainerStatuses:
{{ range .spec.initContainers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  {{ if eq .restartPolicy "Always" }}
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
  {{ else }}
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
      startedAt: {{ $now | Quote }}
  {{ end }}
{{ end }}

hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) \
( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
phase: Running
startTime: {{ $now | Quote }}
"""

_POD_COMPLETE_STATUS = """\
{{ $now := Now }}
{{ $root := . }}
containerStatuses:
{{ range $index, $item := .spec.containers }}
{{ $origin := index $root.status.containerStatuses $index }}
- image: {{ $item.image | Quote }}
  name: {{ $item.name | Quote }}
  ready: false
  restartCount: 0
  started: false
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
      startedAt: {{ $now | Quote }}
{{ end }}
phase: Succeeded
"""


def _stage(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {"resourceRef": {"apiGroup": "v1", "kind": "Pod"}, **spec},
    }


def pod_stages() -> list[dict[str, Any]]:
    """The pod Stages of the pull-modelling kwok (node Stages stay kwok's defaults)."""
    alive = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
    return [
        _stage(
            "pod-ready-after-pull",
            {
                "selector": {
                    "matchExpressions": [
                        alive,
                        {"key": ".status.podIP", "operator": "DoesNotExist"},
                        {"key": f'.metadata.annotations["{READY_AT}"]', "operator": "Exists"},
                    ]
                },
                "delay": {
                    "durationMilliseconds": 0,
                    "durationFrom": {"expressionFrom": f'.metadata.annotations["{READY_AT}"]'},
                },
                "next": {"statusTemplate": _POD_READY_STATUS},
            },
        ),
        # kwok's pod-complete (Job pods finish) and pod-delete, unchanged.
        _stage(
            "pod-complete",
            {
                "selector": {
                    "matchExpressions": [
                        alive,
                        {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                        {
                            "key": ".metadata.ownerReferences.[].kind",
                            "operator": "In",
                            "values": ["Job"],
                        },
                    ]
                },
                "next": {"statusTemplate": _POD_COMPLETE_STATUS},
            },
        ),
        _stage(
            "pod-delete",
            {
                "selector": {
                    "matchExpressions": [
                        {"key": ".metadata.deletionTimestamp", "operator": "Exists"}
                    ]
                },
                "next": {"finalizers": {"empty": True}, "delete": True},
            },
        ),
    ]


def stages_yaml() -> str:
    return yaml.safe_dump_all(pod_stages(), sort_keys=False)


def kwok_argv(kwok: Path, kubeconfig: Path, config: Path, port: int) -> list[str]:
    """The second kwok: only ``=pull`` nodes, with the Stages of ``config``."""
    return [
        str(kwok),
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={PULL_NODE_VALUE}",
        f"--cidr={PULL_POD_CIDR}",
        f"--server-address=127.0.0.1:{port}",
        # As the cluster's kwok (components.kwok_argv): Lease heartbeats.
        "--node-lease-duration-seconds=40",
    ]


def pull_node(
    name: str,
    shape: KwokNodeShape,
    *,
    images: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A kwok Node for the pull-modelling kwok (same taint and labels as any kwok node)."""
    node = kwok_node(name, shape, images=images, labels=labels)
    node["metadata"]["annotations"][KWOK_NODE_ANNOTATION] = PULL_NODE_VALUE
    return node


def rfc3339(epoch_s: float) -> str:
    return dt.datetime.fromtimestamp(epoch_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pod_images(pod: dict[str, Any]) -> list[str]:
    """Every image the kubelet would pull for the pod: init containers first."""
    spec = pod.get("spec") or {}
    return [
        c["image"]
        for key in ("initContainers", "containers")
        for c in spec.get(key) or []
        if c.get("image")
    ]


class PullSimulator:
    """Writes each pod's ready-at on pull-modelled nodes, from the pull model.

    One list+watch per node (``fieldSelector=spec.nodeName=N``), so it sees a
    pod as soon as it is bound. A pod is planned once (by UID): a second
    event for it before our patch shows must not start a second pull. Not
    safe for concurrent use; run it on one event loop.
    """

    def __init__(self, kube: KubeClient, model: PullModel, *, clock: WallClock) -> None:
        self.kube, self.model, self.clock = kube, model, clock
        self._planned: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.waits_ms: dict[str, float] = {}  # pod name -> modelled wait (for tests)

    def watch_node(self, node: str) -> None:
        self._tasks.append(asyncio.create_task(self._watch(node)))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()

    async def _watch(self, node: str) -> None:
        sel = f"spec.nodeName={node}"
        rv: str | None = None
        while True:
            try:
                if rv is None:
                    listed = await self.kube.list(PODS, fieldSelector=sel)
                    for pod in listed["items"]:
                        await self._consider(node, pod)
                    rv = listed["metadata"]["resourceVersion"]
                async for kind, obj in self.kube.watch(
                    PODS, resource_version=rv, fieldSelector=sel
                ):
                    rv = obj["metadata"].get("resourceVersion", rv)
                    if kind in ("ADDED", "MODIFIED"):
                        await self._consider(node, obj)
                    elif kind == "DELETED":
                        self._planned.discard(obj["metadata"].get("uid", ""))
            except WatchExpired:
                rv = None
            except (ApiError, OSError, aiohttp.ClientError, TimeoutError) as e:
                log.warning("pull simulator watch on %s: %s (retrying)", node, e)
                await asyncio.sleep(0.5)

    async def _consider(self, node: str, pod: dict[str, Any]) -> None:
        md = pod["metadata"]
        uid = md.get("uid", "")
        if md.get("deletionTimestamp") or READY_AT in (md.get("annotations") or {}):
            return
        if uid in self._planned:
            return
        self._planned.add(uid)
        now = self.clock()
        plan = self.model.plan(node, pod_images(pod), now)
        wait_ms = round((plan.ready_at - now) * 1000, 1)
        self.waits_ms[md["name"]] = wait_ms
        patch = {
            "metadata": {"annotations": {READY_AT: rfc3339(plan.ready_at), PULL_MS: str(wait_ms)}}
        }
        try:
            await self.kube.patch(
                PODS, md["name"], patch, md["namespace"], content_type=MERGE_PATCH
            )
        except ApiError as e:
            if not e.not_found:
                self._planned.discard(uid)  # try again at its next event
                log.warning("pull simulator: annotating %s failed: %s", md["name"], e)


class PullNodes:
    """kwok nodes whose pods wait for modelled image pulls, for one test or bench.

    ``async with PullNodes(...) as nodes``: starts the second kwok (its pid
    file and log under ``work_dir``), creates the nodes, watches their pods;
    on exit deletes the nodes and stops kwok. Deleting the nodes first
    matters: a node left without its kwok turns NotReady and its pods stay.
    """

    def __init__(
        self,
        kube: KubeClient,
        *,
        kwok: Path,
        kubeconfig: Path,
        work_dir: Path,
        port: int,
        names: Iterable[str],
        model: PullModel,
        clock: WallClock,
        shape: KwokNodeShape | None = None,
        labels: dict[str, str] | None = None,
        images: dict[str, list[str]] | None = None,
    ) -> None:
        self.kube, self.model = kube, model
        self.names = list(names)
        self.shape = shape or KwokNodeShape()
        self.labels = labels or {}
        self.images = images or {}
        config = work_dir / "kwok-pull.yaml"
        self._config_text = stages_yaml()
        self._config = config
        self.proc = ManagedProcess(
            f"kwok-pull-{port}",
            tuple(kwok_argv(kwok, kubeconfig, config, port)),
            work_dir / "run",
            work_dir / "logs",
            stop_timeout_s=5,
        )
        self.sim = PullSimulator(kube, model, clock=clock)

    async def __aenter__(self) -> PullNodes:
        self._config.parent.mkdir(parents=True, exist_ok=True)
        self._config.write_text(self._config_text)
        self.proc.start()
        try:
            for name in self.names:
                held = self.images.get(name, [])
                self.model.hold(name, held)
                entries = [{"names": [i], "sizeBytes": self.model.size_of(i)} for i in held]
                await self.kube.create(
                    NODES, pull_node(name, self.shape, images=entries, labels=self.labels)
                )
                self.sim.watch_node(name)
            await self._wait_ready()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _wait_ready(self, timeout_s: float = 60.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        pending = set(self.names)
        while pending:
            for name in list(pending):
                if is_ready(await self.kube.get(NODES, name)):
                    pending.discard(name)
            if not pending:
                return
            if loop.time() > deadline:
                raise TimeoutError(
                    f"pull-modelled kwok nodes not Ready: {sorted(pending)}; "
                    f"kwok log:\n{self.proc.log_tail()}"
                )
            if self.proc.running_pid() is None:
                raise RuntimeError(f"kwok (pull) exited:\n{self.proc.log_tail()}")
            await asyncio.sleep(0.2)

    async def __aexit__(self, *exc: object) -> None:
        await self.sim.close()
        for name in self.names:
            with contextlib.suppress(ApiError):
                await self.kube.delete(NODES, name)
        self.proc.stop()
