"""A SandmanClient on its own event-loop thread, callable from any loop or thread.

Harnesses call adapters in ways the SDK's single-loop client cannot serve
directly: SWE-agent wraps every runtime call in a fresh ``asyncio.run(...)``
(a new loop each time), Gymnasium's ``step`` is a plain blocking call. An
aiohttp connection pool belongs to the loop that opened it, so the client
lives on one private loop thread and every call is handed over to it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from sandman.client import SandmanClient

T = TypeVar("T")

# Closing the client waits for in-flight requests to end; a loop thread that
# does not stop within this bound is abandoned (it is a daemon thread, so it
# never blocks interpreter exit).
STOP_WAIT_S = 10.0


class LoopClient:
    """One SandmanClient opened on a private event loop in a daemon thread.

    Prevents the "attached to a different loop" failures (and the leaked
    connection pools) of using one aiohttp session from several loops. Thread
    safe: ``run`` and ``call`` may be used from any thread or loop except the
    client's own loop thread, where they would wait on themselves (refused
    with RuntimeError). Share one between many adapters to share one
    connection pool; ``close`` is idempotent.
    """

    def __init__(
        self,
        *,
        kubeconfig: Path | str | None = None,
        namespace: str = "default",
        transport: str = "auto",
        client: SandmanClient | None = None,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name="sandman-adapter"
        )
        self._thread.start()
        self._closed = False
        try:
            self.client = client or self.run(
                _open(kubeconfig=kubeconfig, namespace=namespace, transport=transport)
            )
        except BaseException:
            self._stop_loop()
            raise

    def _check(self) -> None:
        if self._closed:
            raise RuntimeError("this LoopClient was closed; create a new one")
        if threading.current_thread() is self._thread:
            raise RuntimeError("LoopClient.run/call from its own loop thread would deadlock")

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the client's loop and block until it is done."""
        try:
            self._check()
        except RuntimeError:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the client's loop from another loop; cancelling
        the caller cancels it there too."""
        try:
            self._check()
        except RuntimeError:
            coro.close()
            raise
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.run(self.client.close())
        finally:
            self._closed = True
            self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(STOP_WAIT_S)
        if not self._thread.is_alive():
            self.loop.close()

    def __enter__(self) -> LoopClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _open(**kwargs: Any) -> SandmanClient:
    client = SandmanClient(**kwargs)
    await client.open()
    return client
