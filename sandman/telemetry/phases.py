"""A sandbox's start as consecutive phases (pure: what the SDK recorded in, spans out).

The SDK records client-side instants (``sandman.client.sandbox.Timings``,
``time.monotonic``): request, create answered (= admitted: the apiserver
ran the webhooks before answering), node assigned, container running, Ready,
first command's result. The one step the client cannot see is the image
pull: the pod's status does not change when a pull ends. Its length comes
from the kubelet's own ``Pulled`` Events ("Successfully pulled image ... in
1.234s", or "already present": 0), summed over the pod's images (the kubelet
pulls one at a time by default). The pull phase is placed right after
scheduling with that length; the rest of the node's work (pod sandbox and
network, the daemon's init container, container start) is ``start``.
Server timestamps (whole seconds, another machine's clock) are not used to
place anything.

Phases (each from the previous known instant to its own):

    create (or claim)  request -> admitted     the API call, webhooks included
    schedule           admitted -> scheduled
    pull               scheduled -> pulled     length from the kubelet's Events
    start              pulled -> started
    ready              started -> ready        daemon up, readiness passing
    first_command      ready -> first result

A phase whose instant was not recorded (a warm pod claimed Ready has no
schedule, pull, start or ready of its own) is left out, and the next phase
starts at the last instant known.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandman.contract import LABEL_ID, LABEL_POOL

CREATED, CLAIMED, REUSED = "created", "claimed", "reused"

# Go's time.Duration.String(): "1.5s", "532ms", "1m2.5s", "850.123µs", "2h0m1s".
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_GO_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|us|µs|ns|h|m|s)")
_PULLED_IN = re.compile(r'^Successfully pulled image "([^"]+)" in ([0-9.hmsuµn]+)')
_PRESENT = re.compile(r'^Container image "([^"]+)" already present')


class TimingsLike(Protocol):
    requested: float
    created: float | None
    scheduled: float | None
    started: float | None
    ready: float | None
    first_result: float | None


@dataclass(frozen=True)
class Pull:
    image: str
    seconds: float  # 0.0: already present on the node


@dataclass(frozen=True)
class Phase:
    name: str
    start: float  # the SDK's monotonic clock, seconds
    end: float


@dataclass(frozen=True)
class StartTrace:
    source: str  # created | claimed | reused
    start: float
    end: float
    phases: tuple[Phase, ...]
    instants: tuple[tuple[str, float], ...]  # ("admitted", t), ("scheduled", t), ...
    attributes: dict[str, Any] = field(default_factory=dict)


def go_duration(text: str) -> float | None:
    """Seconds in a Go duration string, or None if it is not one."""
    pos, total = 0, 0.0
    for m in _GO_PART.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _GO_UNITS[m.group(2)]
        pos = m.end()
    return total if pos == len(text) and pos else None


def pulls(events: Iterable[Mapping[str, Any]]) -> list[Pull]:
    """The image pulls the kubelet reported for one pod (``Pulled`` Events)."""
    out = []
    for ev in events:
        if ev.get("reason") != "Pulled":
            continue
        msg = str(ev.get("message") or "")
        if m := _PULLED_IN.match(msg):
            secs = go_duration(m.group(2).rstrip("."))
            if secs is not None:
                out.append(Pull(m.group(1), secs))
        elif m := _PRESENT.match(msg):
            out.append(Pull(m.group(1), 0.0))
    return out


def source_of(pod: Mapping[str, Any], t: TimingsLike) -> str:
    if t.created is None:
        return REUSED  # a reset sandbox: its Timings start again at the next request
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return CLAIMED if labels.get(LABEL_POOL) else CREATED


def start_trace(
    t: TimingsLike, pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]] = ()
) -> StartTrace:
    source = source_of(pod, t)
    seen = pulls(events)
    pull_s = sum(p.seconds for p in seen)
    pulled = None
    if t.scheduled is not None and seen and source == CREATED:
        cap = t.started if t.started is not None else t.ready
        pulled = t.scheduled + pull_s if cap is None else min(cap, t.scheduled + pull_s)
    steps = (
        ("claim" if source == CLAIMED else "create", "admitted", t.created),
        ("schedule", "scheduled", t.scheduled),
        ("pull", "pulled", pulled),
        ("start", "started", t.started),
        ("ready", "ready", t.ready),
        ("first_command", "first_command", t.first_result),
    )
    phases, instants = [], []
    last = t.requested
    for name, instant, at in steps:
        if at is None:
            continue
        at = max(at, last)  # never backwards
        phases.append(Phase(name, last, at))
        instants.append((instant, at))
        last = at
    md = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or [{}]
    attrs: dict[str, Any] = {
        "sandman.source": source,
        "k8s.pod.name": str(md.get("name") or ""),
        "k8s.namespace.name": str(md.get("namespace") or ""),
        "k8s.node.name": str(spec.get("nodeName") or ""),
        "container.image.name": str(containers[0].get("image") or ""),
        "sandman.sandbox.id": str((md.get("labels") or {}).get(LABEL_ID) or ""),
    }
    pool = (md.get("labels") or {}).get(LABEL_POOL)
    if pool:
        attrs["sandman.pool"] = pool
    if seen:
        attrs["sandman.pull.seconds"] = round(pull_s, 6)
        attrs["sandman.pull.images"] = [p.image for p in seen]
        attrs["sandman.pull.cached"] = [p.seconds == 0.0 for p in seen]
    return StartTrace(source, t.requested, last, tuple(phases), tuple(instants), attrs)
