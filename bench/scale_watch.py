"""The scale bench's watch: every pod change in its namespace, as ledger events.

Runs in its own process (``start``), so its JSON decoding neither slows the
clients nor is slowed by them, and writes JSON lines (``scale_ledger``'s
``src: watch`` events) that the bench tails while it runs and accounts from
afterwards.

What the earlier benches' watchers got wrong, and this one does not: a watch
started without a list misses every pod created before it opened, and one
that is cut (a long watch over a burst will be; an apiserver restart cuts
all) and reopened without a resourceVersion misses what happened in the gap.
Here: list first (``ready`` is set after it), resume from the last
resourceVersion seen (bookmarks keep it fresh), and after 410 Gone list
again, reporting pods that vanished in between as deleted at the time the
list showed it (later than the truth, never earlier: a reclaim looks slower,
a wrong deletion is never hidden).
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing as mp
import time
from pathlib import Path
from typing import IO, Any

from sandman.bench.scale_ledger import Ledger, expires_of, pod_facts, read_events
from sandman.kube_async import PODS, ApiError, KubeClient, WatchExpired, list_all

log = logging.getLogger("sandman.bench.scale")

# Backoff after a failed watch (the apiserver restarting): short, since the
# bench measures how fast things recover and its watch must not be the lag.
RETRY_S = 0.5
# Server-side watch timeout (a fresh watch now and then, as informers do).
WATCH_TIMEOUT_S = 240
# How stale the file the bench tails may be (it polls about this often).
FLUSH_S = 0.5


class _State:
    """Per pod name: (uid, bound, ready, expires, deleting) last written."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.pods: dict[str, list[Any]] = {}

    def write(self, ev: dict[str, Any]) -> None:
        ev["src"] = "watch"
        self.out.write(json.dumps(ev, separators=(",", ":")) + "\n")

    def update(self, kind: str, pod: dict[str, Any], t: float) -> None:
        md = pod["metadata"]
        name = md["name"]
        st = self.pods.get(name)
        if st is not None and st[0] != md.get("uid", ""):
            # A new pod of the same name: the old one is gone.
            self.gone(name, t)
            st = None
        if st is None:
            facts = pod_facts(pod)
            self.write({"ev": "seen", "t": t, "name": name, **facts})
            st = self.pods[name] = [facts["uid"], False, False, facts["expires"], False]
        if kind == "DELETED":
            self.gone(name, t)
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if node and not st[1]:
            st[1] = True
            self.write({"ev": "bound", "t": t, "name": name, "uid": st[0], "node": node})
        if not st[2] and _ready(pod):
            st[2] = True
            self.write({"ev": "ready", "t": t, "name": name, "uid": st[0]})
        exp = expires_of(pod)
        if exp is not None and exp != st[3]:
            st[3] = exp
            self.write({"ev": "expires", "t": t, "name": name, "uid": st[0], "expires": exp})
        if md.get("deletionTimestamp") and not st[4]:
            st[4] = True
            self.write({"ev": "deleting", "t": t, "name": name, "uid": st[0], "how": "terminating"})

    def gone(self, name: str, t: float, how: str = "watch") -> None:
        st = self.pods.pop(name, None)
        if st is not None and not st[4]:
            self.write({"ev": "deleting", "t": t, "name": name, "uid": st[0], "how": how})


def _ready(pod: dict[str, Any]) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


async def record(kubeconfig: Path, namespace: str, out_path: Path, ready: Any, stop: Any) -> None:
    """List, then watch ``namespace`` until ``stop`` (a multiprocessing Event) is set."""
    with open(out_path, "a", buffering=1 << 16) as out:
        state = _State(out)
        flusher = asyncio.ensure_future(_flush_every(out, FLUSH_S))
        async with KubeClient.from_kubeconfig(
            kubeconfig, user_agent="sandman-bench-watch", max_connections=4
        ) as kube:
            rv = ""
            while not stop.is_set():
                try:
                    if not rv:
                        items, rv = await list_all(kube, PODS, namespace)
                        t = time.time()
                        names = {p["metadata"]["name"] for p in items}
                        for gone in set(state.pods) - names:
                            state.gone(gone, t, how="relist")
                        for p in items:
                            state.update("ADDED", p, t)
                        out.flush()
                        ready.set()
                    async for kind, obj in kube.watch(
                        PODS, namespace, resource_version=rv, timeout_s=WATCH_TIMEOUT_S
                    ):
                        rv = obj["metadata"].get("resourceVersion", rv)
                        if kind != "BOOKMARK":
                            state.update(kind, obj, time.time())
                        if stop.is_set():
                            break
                    out.flush()
                except WatchExpired:
                    rv = ""
                except (ApiError, OSError, TimeoutError, ValueError) as e:
                    log.info("bench watch broke (%s); resuming", e)
                    out.flush()
                    await asyncio.sleep(RETRY_S)
                except Exception as e:  # aiohttp payload errors when the apiserver dies
                    log.info("bench watch broke (%r); resuming", e)
                    out.flush()
                    await asyncio.sleep(RETRY_S)
            flusher.cancel()
            out.flush()


async def _flush_every(out: IO[str], period: float) -> None:
    while True:
        await asyncio.sleep(period)
        out.flush()


async def _stop_checker(stop: Any) -> None:
    while not stop.is_set():
        await asyncio.sleep(0.2)


def _main(kubeconfig: str, namespace: str, out_path: str, ready: Any, stop: Any) -> None:
    async def run() -> None:
        task = asyncio.ensure_future(
            record(Path(kubeconfig), namespace, Path(out_path), ready, stop)
        )
        await _stop_checker(stop)
        # A watch blocks until the next event: give it a moment, then cut it.
        done, _ = await asyncio.wait({task}, timeout=2.0)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())


class Tail:
    """Folds the JSON-lines files of a run directory into a ledger as they grow
    (complete lines only). One per reader thread: not thread-safe."""

    def __init__(self, run_dir: Path, pattern: str = "*.jsonl") -> None:
        self.run_dir, self.pattern = run_dir, pattern
        self.offsets: dict[Path, int] = {}
        self.ledger = Ledger()

    def read(self) -> Ledger:
        for path in sorted(self.run_dir.glob(self.pattern)):
            off = self.offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(off)
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path] = off + end
            for line in data[:end].splitlines():
                try:
                    self.ledger.apply(json.loads(line))
                except ValueError:
                    continue
        return self.ledger


class WatchProcess:
    """The watch in a child process, writing ``out_path``."""

    def __init__(self, kubeconfig: Path, namespace: str, out_path: Path) -> None:
        ctx = mp.get_context("spawn")
        self.path = out_path
        self.ready = ctx.Event()
        self.stop_event = ctx.Event()
        self.proc = ctx.Process(
            target=_main,
            args=(str(kubeconfig), namespace, str(out_path), self.ready, self.stop_event),
            daemon=True,
            name="scale-watch",
        )

    def start(self, timeout: float = 60.0) -> None:
        self.proc.start()
        if not self.ready.wait(timeout):
            raise RuntimeError("the bench's watch did not list the namespace in time")

    def stop(self) -> None:
        if self.proc.pid is None:
            return  # never started
        self.stop_event.set()
        self.proc.join(15)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


__all__ = ["Tail", "WatchProcess", "read_events", "record"]
