"""The placement study's model of image pulls on nodes (pure bookkeeping).

Model assumptions (also reported in the JSON):
- Each node pulls one image at a time, FIFO (kubelet default
  serializeImagePulls: true), at --pull-mbps MB/s including unpacking
  (16 MB/s default: 1.2 GB took 74.9 s more cold than warm on GKE).
- Layers are not shared between task images; a pull fetches the whole image.
- A pod whose image is on disk starts --start-s after placement; one whose
  image is being pulled there starts when that pull ends (shared fetch).
- Image disk holds --disk-gb per node; completing a pull evicts least recently
  used images no running sandbox uses (kubelet image GC, made immediate); if
  every image is in use the disk overflows (counted).
- A sandbox runs --run-s after its first command, then is deleted; the next
  queued sandbox is created at once (concurrency limit). Rollouts of one
  problem are queued together; problems in order.
- TTFC = modeled time from creation to start (scheduling itself is ms and
  left out of the model).
"""

from __future__ import annotations

import argparse
import random
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sandman.bench.report import percentile

GB = 10**9


@dataclass
class Sandbox:
    idx: int
    image: str
    size: int
    arrival: float
    pod: str = ""
    node: str = ""
    ready: float = 0.0
    waited_for_pull: bool = False


@dataclass
class SimNode:
    disk: OrderedDict[str, int] = field(default_factory=OrderedDict)  # LRU, pulled images
    in_use: Counter[str] = field(default_factory=Counter)
    pulling: dict[str, float] = field(default_factory=dict)  # image -> modeled finish
    free_at: float = 0.0  # when its (serial) puller is free
    pulls: int = 0
    bytes_pulled: int = 0
    evictions: int = 0
    overflows: int = 0


class PullModel:
    """The modeled nodes: serialized pulls, LRU disk (see the module docstring).

    Pure bookkeeping; the driver turns its results into API writes. Not
    thread-safe (one event loop).
    """

    def __init__(self, nodes: list[str], disk: float, bandwidth: float, start_s: float):
        self.nodes = {n: SimNode() for n in nodes}
        self.disk, self.bandwidth, self.start_s = disk, bandwidth, start_s

    def place(self, sb: Sandbox, node: str, now: float) -> float | None:
        """Record the placement; returns when a new pull ends (None: no new pull)."""
        n = self.nodes[node]
        n.in_use[sb.image] += 1
        if sb.image in n.disk:
            n.disk.move_to_end(sb.image)
            sb.ready = now + self.start_s
            return None
        sb.waited_for_pull = True
        if sb.image in n.pulling:
            sb.ready = n.pulling[sb.image] + self.start_s
            return None
        begin = max(now, n.free_at)
        n.free_at = end = begin + sb.size / self.bandwidth
        n.pulling[sb.image] = end
        n.pulls += 1
        n.bytes_pulled += sb.size
        sb.ready = end + self.start_s
        return end

    def pulled(self, node: str, image: str, size: int) -> None:
        n = self.nodes[node]
        n.pulling.pop(image, None)
        used = sum(n.disk.values())
        for victim in [k for k in n.disk if n.in_use[k] == 0]:
            if used + size <= self.disk:
                break
            used -= n.disk.pop(victim)
            n.evictions += 1
        if used + size > self.disk:
            n.overflows += 1
        n.disk[image] = size

    def release(self, sb: Sandbox) -> None:
        self.nodes[sb.node].in_use[sb.image] -= 1


def workload(args: argparse.Namespace) -> list[Sandbox]:
    rng = random.Random(args.seed)
    lo, hi = args.image_gb
    out = []
    for k in range(args.images):
        image = f"127.0.0.1:5000/sandman-bench/task-{k:04d}:v1"
        size = int(rng.uniform(lo, hi) * GB)
        out += [Sandbox(len(out) + r, image, size, 0.0) for r in range(args.rollouts)]
    return out


def summarize(
    variant: str, sandboxes: list[Sandbox], model: PullModel, args: argparse.Namespace, wall: float
) -> dict[str, Any]:
    ttfc = [sb.ready - sb.arrival for sb in sandboxes]
    groups: dict[str, set[str]] = {}
    for sb in sandboxes:
        groups.setdefault(sb.image, set()).add(sb.node)
    ns = model.nodes.values()
    return {
        f"{variant}_bytes_pulled_gb": sum(n.bytes_pulled for n in ns) / GB,
        f"{variant}_pulls": sum(n.pulls for n in ns),
        f"{variant}_pulls_per_node": [n.pulls for n in ns],
        f"{variant}_ttfc_p50_s": percentile(ttfc, 50),
        f"{variant}_ttfc_p99_s": percentile(ttfc, 99),
        f"{variant}_ttfc_max_s": max(ttfc),
        f"{variant}_waited_for_pull_frac": sum(sb.waited_for_pull for sb in sandboxes)
        / len(sandboxes),
        f"{variant}_nodes_per_image_mean": sum(len(g) for g in groups.values()) / len(groups),
        f"{variant}_evictions": sum(n.evictions for n in ns),
        f"{variant}_disk_overflows": sum(n.overflows for n in ns),
        f"{variant}_makespan_s": max(sb.ready for sb in sandboxes) + args.run_s,
        f"{variant}_bench_wall_s": wall,
    }


ASSUMPTIONS = [
    "one pull at a time per node, FIFO (kubelet serializeImagePulls: true)",
    "pull+unpack throughput --pull-mbps MB/s per node, whole image, no shared layers",
    "a pod joining a pull in progress starts when it ends; image present: --start-s",
    "image disk --disk-gb per node, LRU eviction of unused images when a pull completes",
    "sandbox runs --run-s after its start, then is deleted and the next one created",
    "rollouts of one problem queued together, problems in order, --concurrency alive",
    "TTFC = modeled creation-to-start time; real scheduling latency (ms) not modeled",
    "node.status.images = the modeled disk (both schedulers see it); pods stay "
    "bound-not-started during their modeled pull (the extender sees it)",
]
