"""`sandman bench podstart`: create -> first command on the real node, 1/16/64 at once, by phase.

For each concurrency level N, N sandboxes (the `tiny` image, already on the
node) are created at the same instant through the SDK; each one's first
command (`true`) is timed from the create call to its result. Every pod's
start is then split into phases from the node's own timestamps
(`podstart_trace`: containerd's CRI log, the runtime's container records,
the daemon's first log line as the runtime stamped it) and the client's (the
create call and answer, the watch, the SDK): admission, scheduling, the
kubelet's pickup, the pod sandbox (pause + CNI), the install init
container, the wait after it (the kubelet's PLEG relist), the sandbox
container, the daemon's start, readiness (probe, status, watch) and the
first exec. Level 1 runs `--runs` times one after the other; 16 and 64 run
`--rounds` times. The load average is recorded next to every level.

`--delivery copy,shared,node` repeats everything with the daemon's shared
and node deliveries (a policy rule `daemonDelivery: shared|node` for the
bench's namespace); with `node` the pod has no install step at all (its init
phases are 0 and `after_init_wait` is the kubelet's way from the pod sandbox
to the sandbox container).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from sandman.bench import podstart_trace as trace
from sandman.bench.delivery import deliveries, delivery_policy, wait_delivery
from sandman.bench.report import table
from sandman.client import Sandbox, SandmanClient
from sandman.contract import LABEL_BENCH, LABEL_NODE_KIND
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.testing import real_node_bench
from sandman.kube_async import NAMESPACES, PODS, ApiError, KubeClient, list_all

REAL = {LABEL_NODE_KIND: "real"}
COMMAND = ["sleep", "infinity"]
INIT, MAIN = "sandman-install", "main"
POD_LOGS = "/var/log/pods"  # the kubelet's podLogsDirectory (its default)
KUBE_CONNECTIONS = 256


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--levels", default="1,16,64", help="sandboxes created at once")
    p.add_argument("--runs", type=int, default=10, help="starts at level 1 (one at a time)")
    p.add_argument("--rounds", type=int, default=2, help="rounds at the other levels")
    p.add_argument("--image", default="tiny")
    p.add_argument("--delivery", default="copy", help="copy, shared, node, or a list: copy,node")
    p.add_argument("--ready", default="daemon",
                   help="the SDK's start signal: daemon (its own answer, the default), "
                   "condition (only the pod's Ready condition, as before), or both "
                   "(condition,daemon: rounds interleaved)")  # fmt: skip
    p.add_argument("--max-load", type=float, default=0.0,
                   help="wait (up to 10 min) for the 1-minute load average to drop below this "
                   "before each level (0: do not wait)")  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    asked = deliveries(args.delivery)
    with real_node_bench(args.image) as (cluster, node, ref):
        results: dict[str, Any] = {"image": ref, "levels": {}}
        kubelet_log = node.layout.logs / "kubelet.log"
        offset = kubelet_log.stat().st_size if kubelet_log.exists() else 0
        for delivery in asked:
            with delivery_policy(cluster, delivery) as ns_labels:
                results["levels"].update(
                    asyncio.run(_bench(args, cluster, node, ref, delivery, ns_labels))
                )
        # The kubelet's API client waits (client-go logs waits over 1 s at -v=1).
        with open(kubelet_log, errors="replace") as f:
            f.seek(offset)
            results["kubelet_throttled_waits"] = sum("client-side throttling" in ln for ln in f)
    # The headline keys: the first delivery with the last signal asked for
    # (the default: copy, daemon).
    head = f"{asked[0]}/{args.ready.split(',')[-1]}"
    for level, doc in results["levels"][head].items():
        results[f"pod_first_command_p50_ms_{level}"] = doc["p50_ms"]["total"]
    print(markdown(results))
    return results


async def _bench(
    args: argparse.Namespace,
    cluster: LocalCluster,
    node: RealNode,
    image: str,
    delivery: str,
    ns_labels: dict[str, str],
) -> dict[str, Any]:
    ns = f"bench-podstart-{secrets.token_hex(3)}"
    signals = args.ready.split(",")
    if not set(signals) <= {"daemon", "condition"}:
        raise SystemExit(f"--ready: daemon, condition or both, not {args.ready!r}")
    out: dict[str, Any] = {f"{delivery}/{sig}": {} for sig in signals}
    # A pool as large as the largest level: each waiting sandbox held a watch
    # of its own before the SDK shared one per namespace.
    kube = KubeClient.from_kubeconfig(cluster.kubeconfig, max_connections=KUBE_CONNECTIONS)
    async with SandmanClient(kube=kube, namespace=ns, transport="direct") as client:
        await client.kube.create(NAMESPACES, {"metadata": {"name": ns, "labels": ns_labels}})
        try:
            # Warm-up (not counted): the daemon image on the node, the
            # webhook's image cache, the namespace key in the client.
            await wait_delivery(client, image, delivery)
            _, errs = await _round(client, node, image, [f"warm-{secrets.token_hex(2)}"], True)
            if errs:
                raise RuntimeError(f"the warm-up sandbox did not start: {errs[0]}")
            for level in (int(x) for x in args.levels.split(",")):
                await _quiet(args.max_load)
                load0 = os.getloadavg()
                rows: dict[str, list[dict[str, float | None]]] = {sig: [] for sig in signals}
                failed: dict[str, list[str]] = {sig: [] for sig in signals}
                repeats = args.runs if level == 1 else args.rounds
                for r in range(repeats):
                    for sig in signals:  # interleaved: both see the same machine
                        names = [f"l{level}-r{r}-{sig[0]}{i}" for i in range(level)]
                        got, errs = await _round(client, node, image, names, sig == "daemon")
                        rows[sig] += got
                        failed[sig] += errs
                load1 = os.getloadavg()
                for sig in signals:
                    doc = {
                        "samples": len(rows[sig]),
                        # Starts that failed (not in the figures), by reason:
                        # on a saturated machine admission can time out.
                        "failed": failed[sig],
                        # Starts with every instant found: their phases add
                        # up to the total exactly (consecutive by design).
                        "complete": sum(all(v is not None for v in r.values()) for r in rows[sig]),
                        "p50_ms": trace.summary(rows[sig], 50),
                        "p90_ms": trace.summary(rows[sig], 90),
                        "max_ms": trace.summary(rows[sig], 100),
                        "load_avg": [round(load0[0], 2), round(load1[0], 2)],
                    }
                    out[f"{delivery}/{sig}"][str(level)] = doc
                    print(
                        f"[{delivery}/{sig}] {level} at once: create -> first command p50 "
                        f"{doc['p50_ms']['total']} ms (load {load0[0]:.1f} -> {load1[0]:.1f}; "
                        f"{len(failed[sig])} failed); p50 by phase (ms): "
                        + ", ".join(f"{k} {v}" for k, v in doc["p50_ms"].items() if k != "total"),
                        flush=True,
                    )
        finally:
            await client.kube.delete(NAMESPACES, ns)
    return out


async def _quiet(max_load: float) -> None:
    if max_load <= 0:
        return
    deadline = time.monotonic() + 600
    while os.getloadavg()[0] > max_load and time.monotonic() < deadline:
        await asyncio.sleep(10)


async def _round(
    client: SandmanClient, node: RealNode, image: str, names: list[str], ask_daemon: bool
) -> tuple[list[dict[str, float | None]], list[str]]:
    """Create ``names`` at once; the phases of each start that succeeded, and
    the reasons of those that failed."""
    ns = client.namespace
    log = node.layout.logs / "containerd.log"
    offset = log.stat().st_size if log.exists() else 0
    traces = {n: trace.PodTrace(n) for n in names}
    cpu0 = node_cpu(node)
    _, rv = await list_all(client.kube, PODS, ns)
    watching = asyncio.create_task(_watch(client, ns, rv, traces))
    sandboxes: list[Sandbox] = []
    try:
        outcomes = await asyncio.gather(
            *(_one(client, image, traces[n], sandboxes, ask_daemon) for n in names),
            return_exceptions=True,
        )
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
    # CPU-seconds the round cost the node, per start (load-independent,
    # unlike the wall-clock phases): pods' cgroups and the node's daemons.
    cpu = {k: (v - cpu0[k]) / len(names) for k, v in node_cpu(node).items()}
    try:
        with open(log, errors="replace") as f:
            f.seek(offset)
            cri = trace.containerd_times(f, {t.uid for t in traces.values()})
        rows, errors = [], []
        for t, outcome in zip(traces.values(), outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome
                errors.append(f"{t.name}: {type(outcome).__name__}: {outcome}"[:300])
                continue
            t.cri = cri.get(t.uid)
            _runtime_times(node, t, ns)
            rows.append({**trace.phases(t, init=INIT, main=MAIN), **cpu})
        return rows, errors
    finally:
        await asyncio.gather(*(sb.release() for sb in sandboxes), return_exceptions=True)
        # A start that failed may have left its pod behind.
        made = {sb.name for sb in sandboxes}
        await asyncio.gather(
            *(client.kube.delete(PODS, n, ns) for n in names if n not in made),
            return_exceptions=True,
        )
        await _gone(client, ns, names)


def node_cpu(node: RealNode) -> dict[str, float]:
    """CPU-seconds used so far by the node's pods (the kubepods cgroup:
    sandboxes, their shims' children, Sandman's in-cluster components,
    CoreDNS) and by its kubelet and containerd processes."""
    root = Path("/sys/fs/cgroup/cpuacct") / node.node.cgroup_root.strip("/") / "kubepods"
    out = {"cpu_pods": 0.0, "cpu_kubelet_containerd": 0.0}
    with contextlib.suppress(OSError, ValueError):
        out["cpu_pods"] = int((root / "cpuacct.usage").read_text()) / 1e9
    tick = os.sysconf("SC_CLK_TCK")
    for proc in node.processes():
        if proc.name not in ("kubelet", "containerd"):
            continue
        pid = proc.running_pid()
        with contextlib.suppress(OSError, ValueError, TypeError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out["cpu_kubelet_containerd"] += (int(fields[11]) + int(fields[12])) / tick
    return out


async def _one(
    client: SandmanClient, image: str, tr: trace.PodTrace, made: list[Sandbox], ask_daemon: bool
) -> None:
    async def create(body: dict[str, Any], ns: str) -> dict[str, Any]:
        pod = await client.kube.create(PODS, body, ns)
        tr.created = time.time()
        tr.uid = pod["metadata"]["uid"]
        return pod  # type: ignore[no-any-return]

    tr.requested = time.time()
    sb = await Sandbox.create(client, image, name=tr.name, command=COMMAND,
                              node_selector=REAL, labels={LABEL_BENCH: "podstart"},
                              create_fn=create, timeout_s=600,
                              ask_daemon=ask_daemon)  # fmt: skip
    made.append(sb)
    tr.sdk_ready = time.time()
    r = await sb.exec(["true"])
    tr.first_result = time.time()
    if r.exit_code != 0:
        raise RuntimeError(f"{tr.name}: first command exited {r.exit_code}")


async def _watch(
    client: SandmanClient, ns: str, rv: str, traces: dict[str, trace.PodTrace]
) -> None:
    while True:
        try:
            async for kind, pod in client.kube.watch(PODS, ns, resource_version=rv, timeout_s=300):
                rv = pod["metadata"].get("resourceVersion", rv)
                tr = traces.get(pod["metadata"].get("name", ""))
                if tr is None or kind == "BOOKMARK":
                    continue
                now = time.time()
                if tr.scheduled is None and (pod.get("spec") or {}).get("nodeName"):
                    tr.scheduled = now
                conds = (pod.get("status") or {}).get("conditions") or []
                if tr.ready_seen is None and any(
                    c.get("type") == "Ready" and c.get("status") == "True" for c in conds
                ):
                    tr.ready_seen = now
        except ApiError:
            _, rv = await list_all(client.kube, PODS, ns)


def _runtime_times(node: RealNode, tr: trace.PodTrace, ns: str) -> None:
    """The init container's end and the sandbox container's start from the
    runtime's records, and the daemon's first log line."""
    if tr.cri is None:
        return
    for name, c in tr.cri.containers.items():
        if not c.id:
            continue
        with contextlib.suppress(Exception):
            started, finished = trace.crictl_times(json.loads(node.crictl("inspect", c.id)))
            if name == INIT:
                tr.init_finished = finished
            elif name == MAIN:
                tr.main_started = started
    logs = Path(trace.pod_log_dir(POD_LOGS, ns, tr.name, tr.uid, MAIN))
    with contextlib.suppress(OSError):
        for f in sorted(logs.glob("*.log")):
            with open(f, errors="replace") as lines:
                tr.daemon_serving = trace.log_line_time(lines, "serving on")
            if tr.daemon_serving is not None:
                break


async def _gone(client: SandmanClient, ns: str, names: list[str], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    want = set(names)
    while time.monotonic() < deadline:
        pods, _ = await list_all(client.kube, PODS, ns)
        if not want & {p["metadata"]["name"] for p in pods}:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"pods of {ns} not gone after {timeout:.0f}s")


def markdown(results: dict[str, Any]) -> str:
    rows: list[tuple[str, Any]] = []
    for case, levels in results["levels"].items():
        for level, doc in levels.items():
            for k, v in doc["p50_ms"].items():
                rows.append((f"{case} x{level} p50 {k} (ms)", v))
            rows.append((f"{case} x{level} p90 total (ms)", doc["p90_ms"]["total"]))
            rows.append((f"{case} x{level} load avg", doc["load_avg"]))
            rows.append((f"{case} x{level} starts (ok / failed)",
                         f"{doc['samples']} / {len(doc.get('failed') or [])}"))  # fmt: skip
    return table("pod start: create -> first command", rows)
