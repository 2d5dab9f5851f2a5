"""A thin synchronous wrapper over the async SDK (for scripts and notebooks).

The async code is the only implementation: this module runs it on a private
event loop in a background thread and blocks on each call. No method is
written twice.

    from sandman.client.sync import connect

    with connect(namespace="rl") as client:
        with client.create(image) as sb:
            print(sb.exec("echo hi").stdout)
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from sandman.client.client import SandmanClient
from sandman.client.sandbox import Sandbox

T = TypeVar("T")


class _Loop:
    """An event loop on a daemon thread. Thread-safe: run() may be called from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name="sandman-sdk"
        )
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class _Sync:
    """Exposes an async object's coroutine methods as blocking calls."""

    def __init__(self, target: Any, loop: _Loop) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_loop", loop)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if inspect.iscoroutinefunction(attr):

            def call(*args: Any, **kwargs: Any) -> Any:
                return _wrap(self._loop.run(attr(*args, **kwargs)), self._loop)

            return call
        if inspect.isasyncgenfunction(attr):

            def iterate(*args: Any, **kwargs: Any) -> list[Any]:
                async def collect() -> list[Any]:
                    return [x async for x in attr(*args, **kwargs)]

                return self._loop.run(collect())

            return iterate
        return attr


def _wrap(value: Any, loop: _Loop) -> Any:
    # Handles returned by the SDK (sessions, processes) get the same treatment.
    if hasattr(value, "sandbox") and hasattr(value, "id"):
        return _Sync(value, loop)
    return value


class SyncSandbox(_Sync):
    def __enter__(self) -> SyncSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.run(self._target.release())


class SyncClient:
    def __init__(self, **kwargs: Any) -> None:
        self._loop = _Loop()
        self.client = SandmanClient(**kwargs)
        self._loop.run(self.client.open())

    def create(self, image: str, **kwargs: Any) -> SyncSandbox:
        return SyncSandbox(self._loop.run(Sandbox.create(self.client, image, **kwargs)), self._loop)

    def attach(self, name: str, namespace: str | None = None) -> SyncSandbox:
        return SyncSandbox(self._loop.run(Sandbox.attach(self.client, name, namespace)), self._loop)

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run any coroutine function of the async SDK on this client's loop."""
        return self._loop.run(fn(*args, **kwargs))  # type: ignore[arg-type]

    def close(self) -> None:
        try:
            self._loop.run(self.client.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(**kwargs: Any) -> SyncClient:
    return SyncClient(**kwargs)
