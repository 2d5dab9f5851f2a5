"""Sandbox creates from several client processes, none lost, each on the record.

Each process runs an asyncio ``KubeClient`` (the product's client: its 429
handling is part of what is measured) with a bounded number of creates in
flight, and writes one ``scale_ledger`` ``create`` event per pod to its own
JSON-lines file. Pod names are fixed in advance, which makes a create safe
to send again: after a broken connection or a webhook failure the bench
cannot know whether the pod was stored, so it sends the same create again,
and a 409 AlreadyExists means the earlier one was (the pod is then read for
its uid and lease). Refusals that are answers (403 policy denial, 400, 422)
are recorded and not repeated.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from sandman.bench.scale_ledger import expires_of
from sandman.contract import ANN_TTL, LABEL_BENCH, LABEL_SANDBOX
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, on_kwok
from sandman.kube_async import PODS, ApiError, KubeClient

# Waits between sends of a create that failed without an answer (apiserver
# restarting, webhook unreachable: "failed calling webhook"), doubling: the
# apiserver here restarts in ~5 s, a killed webhook replica is replaced in
# about as long.
RETRY_START_S = 0.2
RETRY_MAX_S = 5.0


def sandbox_pod(name: str, ttl_s: int, *, bench: str = "scale") -> dict[str, Any]:
    """A tiny sandbox for a kwok node. It names its command, so admission never
    asks a registry for the image's ENTRYPOINT (kwok pods run nothing)."""
    return {
        "metadata": {
            "name": name,
            "labels": {LABEL_SANDBOX: "true", LABEL_BENCH: bench},
            "annotations": {ANN_TTL: f"{ttl_s}s"},
        },
        "spec": on_kwok(
            {
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": KWOK_IMAGE, "command": ["sleep", "inf"]}],
            }
        ),
    }


def bystander_pod(name: str, *, bench: str = "scale") -> dict[str, Any]:
    """Not a sandbox, but with a lease long past: nothing may delete it."""
    pod = sandbox_pod(name, 1, bench=bench)
    md = pod["metadata"]
    md["labels"] = {LABEL_BENCH: bench}
    md["annotations"] = {"sandman.dev/expires-at": "2020-01-01T00:00:00Z"}
    return pod


@dataclass(frozen=True)
class Batch:
    """What one client process creates: names ``{prefix}{i}`` for i in range(start, stop)."""

    kubeconfig: str
    namespace: str
    prefix: str
    start: int
    stop: int
    ttl_s: int
    concurrency: int
    out: str  # JSON-lines file
    kind: str = "sandbox"
    deadline_s: float = 3600.0  # give up on a create after this long (recorded, never silent)
    rate: float | None = (
        None  # creates started per second by this process (None: as fast as it can)
    )


@dataclass
class Tally:
    created: int = 0
    existed: int = 0  # 409 on a resend: the earlier send had stored it
    refused: dict[int, int] = field(default_factory=dict)  # status -> count (answers)
    retries: int = 0  # sends again after no answer / a webhook failure
    throttled: dict[int, int] = field(default_factory=dict)  # 429/5xx+Retry-After answers
    throttled_wait_s: float = 0.0
    lost: int = 0  # gave up at the deadline (should stay 0)
    seconds: float = 0.0


def _retryable(e: BaseException) -> bool:
    if isinstance(e, ApiError):
        # 500 "failed calling webhook" (a replica died mid-call, the Service
        # had no endpoint yet), 503/504 from an apiserver starting or timing out.
        return e.status >= 500
    return isinstance(e, (OSError, TimeoutError, aiohttp.ClientError, asyncio.TimeoutError))


async def _create_one(
    kube: KubeClient, b: Batch, i: int, out: Any, tally: Tally, t_end: float
) -> None:
    name = f"{b.prefix}{i}"
    body = sandbox_pod(name, b.ttl_s) if b.kind == "sandbox" else bystander_pod(name)
    t0 = time.time()
    attempts, delay = 0, RETRY_START_S
    ev: dict[str, Any] = {"src": "bench", "ev": "create", "name": name, "kind": b.kind, "t0": t0}
    while True:
        attempts += 1
        try:
            pod = await kube.create(PODS, body, b.namespace)
            ev.update(code=201, uid=pod["metadata"]["uid"], expires=expires_of(pod))
            tally.created += 1
            break
        except ApiError as e:
            if e.status == 409 and attempts > 1:
                try:
                    pod = await kube.get(PODS, name, b.namespace)
                except (ApiError, OSError, TimeoutError, aiohttp.ClientError) as ge:
                    if time.time() > t_end:
                        ev.update(code=-1, error=str(ge))
                        tally.lost += 1
                        break
                    await asyncio.sleep(delay)
                    continue
                ev.update(code=201, uid=pod["metadata"]["uid"], expires=expires_of(pod))
                tally.existed += 1
                break
            if not _retryable(e):
                ev.update(code=e.status, error=str(e)[:300])
                tally.refused[e.status] = tally.refused.get(e.status, 0) + 1
                break
            last = str(e)
        except Exception as e:
            if not _retryable(e):
                raise
            last = repr(e)
        if time.time() > t_end:
            ev.update(code=-1, error=last[:300])
            tally.lost += 1
            break
        tally.retries += 1
        await asyncio.sleep(delay)
        delay = min(delay * 2, RETRY_MAX_S)
    ev.update(t=time.time(), attempts=attempts)
    out.write(json.dumps(ev, separators=(",", ":")) + "\n")


async def run_batch(b: Batch) -> Tally:
    tally = Tally()
    t_start = time.time()
    t_end = t_start + b.deadline_s
    sem = asyncio.Semaphore(b.concurrency)
    kube = KubeClient.from_kubeconfig(
        b.kubeconfig, user_agent="sandman-bench-scale", max_connections=b.concurrency
    )
    with open(b.out, "a", buffering=1 << 16) as out:
        async with kube:

            async def one(i: int) -> None:
                if b.rate:
                    # Paced: create i starts at its slot, whatever the others do.
                    await asyncio.sleep(max(0.0, t_start + (i - b.start) / b.rate - time.time()))
                async with sem:
                    await _create_one(kube, b, i, out, tally, t_end)

            await asyncio.gather(*(one(i) for i in range(b.start, b.stop)))
        tally.throttled = {int(k): v for k, v in kube.throttled.items()}
        tally.throttled_wait_s = kube.throttled_wait_s
    tally.seconds = time.time() - t_start
    return tally


def _main(b: Batch, results: Any) -> None:
    tally = asyncio.run(run_batch(b))
    results.put((b.prefix, b.start, tally.__dict__))


class ClientFleet:
    """Several client processes splitting one range of names between them."""

    def __init__(self, batches: list[Batch]) -> None:
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.procs = [
            ctx.Process(target=_main, args=(b, self.results), daemon=True, name=f"scale-client-{k}")
            for k, b in enumerate(batches)
        ]
        self.tallies: list[dict[str, Any]] = []

    @classmethod
    def split(
        cls,
        *,
        kubeconfig: Path,
        namespace: str,
        prefix: str,
        count: int,
        processes: int,
        concurrency: int,
        ttl_s: int,
        out_dir: Path,
        kind: str = "sandbox",
        offset: int = 0,
        rate: float | None = None,
    ) -> ClientFleet:
        """``count`` creates over ``processes`` processes; ``rate`` (creates/s in
        all) paces them, else they go as fast as ``concurrency`` allows."""
        per = -(-count // processes)
        batches = []
        for k in range(processes):
            lo, hi = offset + k * per, offset + min(count, (k + 1) * per)
            if lo >= hi:
                break
            batches.append(
                Batch(
                    str(kubeconfig),
                    namespace,
                    prefix,
                    lo,
                    hi,
                    ttl_s,
                    concurrency,
                    str(out_dir / f"{prefix.rstrip('-')}-{k}.jsonl"),
                    kind=kind,
                    rate=None if rate is None else rate / processes,
                )
            )
        return cls(batches)

    def start(self) -> None:
        for p in self.procs:
            p.start()

    def run_all(self, timeout: float | None = None) -> dict[str, Any]:
        self.start()
        return self.join(timeout)

    def alive(self) -> bool:
        return any(p.is_alive() for p in self.procs)

    def join(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait for every process; the tallies summed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self.tallies) < len(self.procs):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            _, _, t = self.results.get(timeout=left)
            self.tallies.append(t)
        for p in self.procs:
            p.join()
        return merge_tallies(self.tallies)


def merge_tallies(tallies: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {
        "created": 0,
        "existed": 0,
        "retries": 0,
        "lost": 0,
        "refused": {},
        "throttled": {},
        "throttled_wait_s": 0.0,
        "seconds": 0.0,
    }
    for t in tallies:
        for k in ("created", "existed", "retries", "lost"):
            total[k] += t[k]
        for k in ("refused", "throttled"):
            for code, n in t[k].items():
                total[k][str(code)] = total[k].get(str(code), 0) + n
        total["throttled_wait_s"] += t["throttled_wait_s"]
        total["seconds"] = max(total["seconds"], t["seconds"])
    return total
