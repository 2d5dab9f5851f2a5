"""A sandbox's start, phase by phase, from the node's own timestamps (pure).

Kubernetes' API timestamps (creationTimestamp, conditions, startedAt) have
one-second resolution: useless for a start that takes one or two seconds. The
node keeps finer ones, and this module reads them:

- containerd's CRI log (info level, nanoseconds): ``RunPodSandbox for
  &PodSandboxMetadata{Name:N,Uid:U,Namespace:NS,...}`` and its ``returns
  sandbox id``; ``CreateContainer within sandbox "S" for container
  &ContainerMetadata{Name:C,...}`` and its ``returns container id``;
  ``StartContainer for "ID"`` and its ``returns successfully``;
- the container runtime's own record of a container (``crictl inspect``:
  ``startedAt``/``finishedAt`` in nanoseconds), for when the init container
  ended;
- the container's log file as the kubelet stores it (each line stamped by
  the runtime, nanoseconds), for the daemon's ``serving on`` line;
- and what the client saw, in wall-clock time: the create call and its
  answer, the watch events (bound to a node, Ready), the first command's
  result.

``phases`` turns one pod's instants into consecutive phases that add up to
create -> first command.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

_TIME = re.compile(r'^time="([^"]+)"')
_SANDBOX = re.compile(r"RunPodSandbox for &PodSandboxMetadata\{Name:([^,]*),Uid:([^,]*),")
_SANDBOX_ID = re.compile(r'returns sandbox id \\"([0-9a-f]+)\\"')
_CREATE = re.compile(
    r'CreateContainer within sandbox \\"([0-9a-f]+)\\" for (?:container )?'
    r"&ContainerMetadata\{Name:([^,]*),Attempt:(\d+),\}"
)
_CONTAINER_ID = re.compile(r'returns container id \\"([0-9a-f]+)\\"')
_START = re.compile(r'StartContainer for \\"([0-9a-f]+)\\"')


def parse_time(value: str) -> float:
    """RFC 3339 with up to nanoseconds (containerd, CRI logs) -> epoch seconds."""
    value = value.strip()
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    m = re.match(r"^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?([+-]\d\d:\d\d)$", value)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {value!r}")
    base, frac, tz = m.groups()
    t = dt.datetime.fromisoformat(base + tz).timestamp()
    return t + (float("0." + frac) if frac else 0.0)


@dataclass
class ContainerTimes:
    id: str = ""
    create_begin: float | None = None
    create_end: float | None = None
    start_begin: float | None = None
    start_end: float | None = None


@dataclass
class SandboxTimes:
    """One pod's sandbox and containers as containerd logged them (first attempt)."""

    uid: str
    name: str
    sandbox_id: str = ""
    begin: float | None = None
    end: float | None = None
    containers: dict[str, ContainerTimes] = field(default_factory=dict)


def containerd_times(lines: Iterable[str], uids: set[str] | None = None) -> dict[str, SandboxTimes]:
    """Pod UID -> its sandbox's and containers' CRI calls, from containerd's log."""
    by_uid: dict[str, SandboxTimes] = {}
    by_sandbox: dict[str, SandboxTimes] = {}
    by_container: dict[str, ContainerTimes] = {}
    for line in lines:
        if "level=info" not in line:
            continue
        tm = _TIME.match(line)
        if not tm:
            continue
        if "RunPodSandbox for" in line:
            m = _SANDBOX.search(line)
            if not m or (uids is not None and m.group(2) not in uids):
                continue
            t = parse_time(tm.group(1))
            sb = by_uid.setdefault(m.group(2), SandboxTimes(m.group(2), m.group(1)))
            sid = _SANDBOX_ID.search(line)
            if sid:
                if sb.end is None:
                    sb.end, sb.sandbox_id = t, sid.group(1)
                    by_sandbox[sb.sandbox_id] = sb
            elif sb.begin is None:
                sb.begin = t
        elif "CreateContainer within sandbox" in line:
            m = _CREATE.search(line)
            if not m or m.group(1) not in by_sandbox or m.group(3) != "0":
                continue
            t = parse_time(tm.group(1))
            c = by_sandbox[m.group(1)].containers.setdefault(m.group(2), ContainerTimes())
            cid = _CONTAINER_ID.search(line)
            if cid:
                c.create_end, c.id = t, cid.group(1)
                by_container[c.id] = c
            else:
                c.create_begin = t
        elif "StartContainer for" in line:
            m = _START.search(line)
            if not m or m.group(1) not in by_container:
                continue
            c = by_container[m.group(1)]
            t = parse_time(tm.group(1))
            if "returns successfully" in line:
                c.start_end = t
            else:
                c.start_begin = t
    return by_uid


def log_line_time(lines: Iterable[str], needle: str) -> float | None:
    """The runtime's timestamp of the first CRI log line containing ``needle``."""
    for line in lines:
        if needle in line:
            return parse_time(line.split(" ", 1)[0])
    return None


@dataclass
class PodTrace:
    """Wall-clock instants (epoch seconds) of one sandbox's start."""

    name: str
    uid: str = ""
    requested: float | None = None  # the create call was sent
    created: float | None = None  # its answer came back (admission done)
    scheduled: float | None = None  # the watch saw spec.nodeName
    ready_seen: float | None = None  # the watch saw Ready=True
    sdk_ready: float | None = None  # Sandbox.create returned
    first_result: float | None = None  # the first command's result arrived
    init_finished: float | None = None  # crictl: the install step's finishedAt
    main_started: float | None = None  # crictl: the sandbox container's startedAt
    daemon_serving: float | None = None  # the daemon's "serving on" log line
    cri: SandboxTimes | None = None


# Consecutive phases: (name, from, to). Each instant is an attribute of
# PodTrace or "<container>.<field>" of its containerd times.
PHASES: tuple[tuple[str, str, str], ...] = (
    ("admission", "requested", "created"),
    ("scheduling", "created", "scheduled"),
    ("kubelet_to_sandbox", "scheduled", "sandbox.begin"),
    ("sandbox_pause_cni", "sandbox.begin", "sandbox.end"),
    ("init_create_start", "sandbox.end", "init.start_end"),
    ("init_run", "init.start_end", "init_finished"),
    ("after_init_wait", "init_finished", "main.create_begin"),
    ("main_create_start", "main.create_begin", "main.start_end"),
    ("daemon_start", "main.start_end", "daemon_serving"),
    ("readiness", "daemon_serving", "sdk_ready"),
    ("first_exec", "sdk_ready", "first_result"),
)


def instant(tr: PodTrace, key: str, init: str, main: str) -> float | None:
    if key == "sandbox.begin":
        return tr.cri.begin if tr.cri else None
    if key == "sandbox.end":
        return tr.cri.end if tr.cri else None
    if "." in key:
        who, attr = key.split(".", 1)
        if tr.cri is None:
            return None
        c = tr.cri.containers.get(init if who == "init" else main)
        return getattr(c, attr) if c else None
    return getattr(tr, key)  # type: ignore[no-any-return]


def phases(tr: PodTrace, *, init: str, main: str) -> dict[str, float | None]:
    """Seconds spent in each phase (None when an instant is missing; a pod
    without an init container has 0 for the init phases), and the total."""
    out: dict[str, float | None] = {}
    no_init = tr.cri is not None and init not in tr.cri.containers
    for name, a, b in PHASES:
        if no_init and name == "after_init_wait":
            a = "sandbox.end"  # the sandbox container follows the pod sandbox
        elif no_init and (a.startswith("init") or b.startswith("init")):
            out[name] = 0.0
            continue
        ta, tb = instant(tr, a, init, main), instant(tr, b, init, main)
        out[name] = None if ta is None or tb is None else tb - ta
    total = None
    if tr.requested is not None and tr.first_result is not None:
        total = tr.first_result - tr.requested
    out["total"] = total
    return out


def summary(traces: list[dict[str, float | None]], q: float) -> dict[str, float | None]:
    """Per phase, the q-th percentile (nearest rank) over pods, in ms."""
    from sandman import stats

    keys = list(traces[0]) if traces else []
    out: dict[str, float | None] = {}
    for k in keys:
        vals = [v for t in traces if (v := t.get(k)) is not None]
        p = stats.percentile(vals, q)
        out[k] = None if p is None else round(p * 1000, 1)
    return out


def pod_log_dir(root: str, namespace: str, name: str, uid: str, container: str) -> str:
    """Where the kubelet keeps a container's log files (``podLogsDirectory``)."""
    return f"{root}/{namespace}_{name}_{uid}/{container}"


def crictl_times(doc: dict[str, Any]) -> tuple[float | None, float | None]:
    """(startedAt, finishedAt) from ``crictl inspect -o json`` (0 = not yet)."""
    st = doc.get("status") or {}

    def t(v: Any) -> float | None:
        if not v or str(v).startswith("0001-") or str(v).startswith("1970-01-01T00:00:00Z"):
            return None
        return parse_time(str(v))

    return t(st.get("startedAt")), t(st.get("finishedAt"))
