"""Lease extensions, as an RL trainer holding its sandboxes makes them.

A ``LeaseKeeper`` keeps every lease of the pods it is given (by name prefix)
at least half a lease ahead of now by moving ``sandman.dev/expires-at`` (a
merge patch the validating webhook admits), and, once told each pod's final
end (``set_final``), moves it there instead, so that the leases of a held
fleet end on a planned schedule. Every patch and its answer is a ledger
``extend`` event: applied or not, and whether the pod was already
terminating (then it came too late to count).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from sandman.bench.scale_watch import Tail
from sandman.contract import ANN_EXPIRES_AT
from sandman.kube_async import MERGE_PATCH, PODS, ApiError, KubeClient

# How often the keeper looks for leases to move (a lease is moved when less
# than half of it is left, so a second is plenty of slack).
PERIOD_S = 1.0


def rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(int(t), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def next_end(
    lease_end: float, now: float, lease_s: float, final: float | None, renew_at: float = 0.5
) -> float | None:
    """Where a lease should be moved now, or None to leave it (pure).

    Without a final end: when less than ``renew_at`` of a lease is left (half
    by default), to a whole lease from now. With one: never past it, and to
    it once a whole lease from now would reach it. A lease is never shortened
    (the ledger takes the latest end a lease had as the one in force): a final
    end before the current one leaves the lease where it is.
    """
    if lease_end - now >= lease_s * renew_at:
        return None
    target = now + lease_s if final is None else min(now + lease_s, final)
    target = float(math.ceil(target))
    return target if target > lease_end + 0.5 else None


def final_ends(names: list[str], start: float, window_s: float) -> dict[str, float]:
    """Each name's final lease end, spread evenly over [start, start + window_s)
    in the given order (whole seconds, as the annotation keeps them)."""
    n = max(1, len(names))
    return {name: float(math.ceil(start + window_s * i / n)) for i, name in enumerate(names)}


class LeaseKeeper:
    """Runs in its own thread and event loop. ``set_final`` is thread-safe."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        run_dir: Path,
        prefix: str,
        lease_s: float,
        record: Callable[[dict[str, Any]], None],
        concurrency: int = 32,
        renew_at: float = 0.5,
    ) -> None:
        self.kubeconfig, self.namespace, self.run_dir = kubeconfig, namespace, run_dir
        self.prefix, self.lease_s, self.record = prefix, lease_s, record
        self.concurrency = concurrency
        self.renew_at = renew_at
        self._final: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name="scale-leases")
        self.sent = 0
        self.failed = 0

    def set_final(self, final: dict[str, float]) -> None:
        with self._lock:
            self._final = dict(final)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        tail = Tail(self.run_dir, "watch.jsonl")
        confirmed: dict[str, float] = {}
        inflight: set[str] = set()
        sem = asyncio.Semaphore(self.concurrency)
        tasks: set[asyncio.Task[None]] = set()
        async with KubeClient.from_kubeconfig(
            self.kubeconfig, user_agent="sandman-bench-leases", max_connections=self.concurrency
        ) as kube:

            async def move(name: str, uid: str, end: float) -> None:
                async with sem:
                    t0 = time.time()
                    ev: dict[str, Any] = {"ev": "extend", "name": name, "uid": uid, "t0": t0}
                    ev["expires"] = end
                    patch = {"metadata": {"annotations": {ANN_EXPIRES_AT: rfc3339(end)}}}
                    try:
                        pod = await kube.patch(
                            PODS, name, patch, self.namespace, content_type=MERGE_PATCH
                        )
                        ev["ok"] = True
                        ev["terminating"] = bool(pod["metadata"].get("deletionTimestamp"))
                        confirmed[name] = end
                        self.sent += 1
                    except (ApiError, OSError, TimeoutError, aiohttp.ClientError) as e:
                        ev.update(ok=False, error=str(e)[:200])
                        self.failed += 1
                    ev["t"] = time.time()
                    self.record(ev)
                    inflight.discard(name)

            while not self._stop.is_set():
                ledger = tail.read()
                now = time.time()
                with self._lock:
                    final = self._final
                for r in list(ledger.pods.values()):
                    if (
                        not r.name.startswith(self.prefix)
                        or r.deleting_at is not None
                        or r.lease_end is None
                        or r.name in inflight
                    ):
                        continue
                    current = max(r.lease_end, confirmed.get(r.name, 0.0))
                    end = next_end(current, now, self.lease_s, final.get(r.name), self.renew_at)
                    if end is None:
                        continue
                    inflight.add(r.name)
                    t = asyncio.ensure_future(move(r.name, r.uid, end))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                await asyncio.sleep(PERIOD_S)
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
