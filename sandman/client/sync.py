"""The synchronous SDK: plain calls for scripts, notebooks and E2B-style code.

    from sandman import Sandbox

    with Sandbox.create("127.0.0.1:5000/sandman/swe:1") as sb:
        r = sb.run("python3 -m unittest", cwd="/work/repo")
        print(r.exit_code, r.stdout)
        sb.files.write("/tmp/notes.txt", "hello")
        print(sb.files.read("/tmp/notes.txt"))

The async code is the only implementation: this module runs it on a private
event loop in a background thread and blocks on each call, so no method is
written twice and every method of the async ``Sandbox`` is here too, blocking
(``sb.exec``, ``sb.session()``, ``sb.start()``, ``sb.reset()``...). Calls may
come from any thread at once: they all run as tasks of that one loop.

``Sandbox.create`` needs no client: the cluster, credentials and namespace
come from the environment as for the CLI (``$KUBECONFIG``, ``~/.kube/config``,
in a pod its service account), and sandboxes made that way share one
process-wide client per kubeconfig and context (one connection pool). Pass
``client=connect(...)`` to choose the settings and the client's lifetime.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import inspect
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from sandman.client.bounded import MAX_FILE_BYTES
from sandman.client.client import SandmanClient
from sandman.client.errors import ClientClosed, DaemonError
from sandman.client.results import ExecResult
from sandman.client.sandbox import DEFAULT_TIMEOUT_S
from sandman.client.sandbox import Sandbox as AsyncSandbox
from sandman.client.transport import Transport

T = TypeVar("T")


class _Loop:
    """An event loop on a daemon thread. Thread-safe: run() may be called from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name="sandman-sdk"
        )
        self.thread.start()
        self.stopped = False

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.stopped:
            coro.close()
            raise ClientClosed("this client was closed; create a new one")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            # Ctrl-C while waiting: the call must not go on running on the
            # loop behind the caller's back (no-op once it has ended).
            future.cancel()
            raise

    def stop(self) -> None:
        self.stopped = True
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


class Files:
    """``sb.files``: a sandbox's files, with E2B's method names."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def read(
        self,
        path: str,
        format: Literal["text", "bytes"] = "text",
        *,
        max_bytes: int = MAX_FILE_BYTES,
    ) -> Any:
        """The file's content: text (UTF-8, undecodable bytes replaced) by
        default, its bytes exactly as stored with ``format="bytes"``."""
        if format not in ("text", "bytes"):
            raise ValueError('format must be "text" or "bytes"')
        data: bytes = self._sb._run(self._sb.aio.read_file(path, max_bytes=max_bytes))
        return data if format == "bytes" else data.decode(errors="replace")

    def write(self, path: str, data: str | bytes, *, mode: str = "0644") -> None:
        """Write the whole file (parent directories are made)."""
        self._sb._run(self._sb.aio.write_file(path, data, mode=mode))

    def list(self, path: str) -> list[dict[str, Any]]:
        """The directory's entries: ``name``, ``path``, ``type``, ``size``, ``mode``..."""
        return self._sb._run(self._sb.aio.list_dir(path))

    def exists(self, path: str) -> bool:
        try:
            self._sb._run(self._sb.aio.stat(path))
        except DaemonError as e:
            if e.status == 404:
                return False
            raise
        return True

    def make_dir(self, path: str) -> None:
        """Make the directory and its parents (no error if it exists)."""
        self._sb._run(self._sb.aio.mkdir(path))

    def rename(self, old_path: str, new_path: str) -> None:
        self._sb._run(self._sb.aio.move(old_path, new_path))

    def remove(self, path: str) -> None:
        """Remove a file, or a directory with everything in it (as E2B's)."""
        self._sb._run(self._sb.aio.remove(path, recursive=True))


class Sandbox(_Sync):
    """A sandbox, with blocking calls. Every method of the async
    ``sandman.client.Sandbox`` is available, blocking; the ones below are
    the everyday ones. ``aio`` is the async handle itself."""

    def __init__(self, target: AsyncSandbox, client: SyncClient) -> None:
        super().__init__(target, client._loop)
        object.__setattr__(self, "client", client)
        object.__setattr__(self, "files", Files(self))

    @property
    def aio(self) -> AsyncSandbox:
        return self._target  # type: ignore[no-any-return]

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro)

    @classmethod
    def create(
        cls,
        image: str,
        *,
        client: SyncClient | None = None,
        namespace: str | None = None,
        ttl: str | None = None,
        idle_timeout: str | None = None,
        env: Mapping[str, str] | None = None,
        command: Sequence[str] | None = None,
        timeout_s: float = 300.0,
        **kwargs: Any,
    ) -> Sandbox:
        """Create a sandbox from ``image`` and wait until it takes commands.

        ``client``: a ``connect(...)`` client; None: the process-wide default
        one (the environment's kubeconfig, context and namespace).
        ``namespace`` None: the client's. Other keywords are the async
        ``Sandbox.create``'s (``resources``, ``profile``, ``labels``,
        ``node_selector``...). SandboxStartError(reason, retryable) if it
        cannot start; nothing is left behind then.
        """
        c = client if client is not None else default_client()
        return c.create(
            image,
            namespace=namespace,
            ttl=ttl,
            idle_timeout=idle_timeout,
            env=env,
            command=command,
            timeout_s=timeout_s,
            **kwargs,
        )

    @classmethod
    def attach(
        cls, name: str, *, client: SyncClient | None = None, namespace: str | None = None
    ) -> Sandbox:
        """A handle on an existing sandbox pod (``sb.name``, or one made by
        kubectl, a Job or a pool). E2B's name for it is ``connect``."""
        c = client if client is not None else default_client()
        return c.attach(name, namespace)

    connect = attach

    def run(
        self,
        cmd: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run a command to its end: ``exit_code``, ``stdout``, ``stderr``,
        ``timed_out``... A string runs under ``/bin/sh -c``; a list is argv.
        A non-zero exit is a result, not an exception."""
        return self._run(
            self.aio.exec(
                cmd,
                cwd=cwd,
                env=env,
                stdin=stdin,
                timeout_s=timeout_s,
                max_output_bytes=max_output_bytes,
            )
        )

    def kill(self) -> None:
        """Delete the sandbox's pod (idempotent)."""
        self._run(self.aio.release())

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def __repr__(self) -> str:
        return repr(self._target)


# The old name of the sync handle.
SyncSandbox = Sandbox


class SyncClient:
    """A SandmanClient on its own event-loop thread; its keywords are
    SandmanClient's (``kubeconfig``, ``context``, ``namespace``, ``transport``...)."""

    def __init__(self, **kwargs: Any) -> None:
        self._loop = _Loop()
        try:
            self.client = SandmanClient(**kwargs)
            self._loop.run(self.client.open())
        except BaseException:
            self._loop.stop()
            raise

    @property
    def namespace(self) -> str:
        return self.client.namespace

    def create(self, image: str, **kwargs: Any) -> Sandbox:
        return Sandbox(self._loop.run(AsyncSandbox.create(self.client, image, **kwargs)), self)

    def attach(self, name: str, namespace: str | None = None) -> Sandbox:
        return Sandbox(self._loop.run(AsyncSandbox.attach(self.client, name, namespace)), self)

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run any coroutine function of the async SDK on this client's loop."""
        return self._loop.run(fn(*args, **kwargs))  # type: ignore[arg-type]

    def close(self) -> None:
        if self._loop.stopped:
            return
        try:
            self._loop.run(self.client.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    *,
    kubeconfig: Path | str | None = None,
    context: str | None = None,
    namespace: str | None = None,
    transport: Transport | str = "auto",
    **kwargs: Any,
) -> SyncClient:
    """A client of its own (close it, or use ``with``): for settings other
    than the environment's, or to control when its connections close."""
    return SyncClient(
        kubeconfig=kubeconfig, context=context, namespace=namespace, transport=transport, **kwargs
    )


_defaults: dict[str, SyncClient] = {}
_defaults_lock = threading.Lock()


def default_client() -> SyncClient:
    """The process-wide client of ``Sandbox.create()`` without ``client=``:
    made on first use from the environment, closed at exit."""
    with _defaults_lock:
        c = _defaults.get("")
        if c is None or c._loop.stopped:
            c = _defaults[""] = SyncClient()
        return c


def _forget_defaults_in_child() -> None:
    # A forked child has the parent's clients but not their loop threads: a
    # call would wait forever. It makes its own on first use.
    global _defaults_lock
    _defaults.clear()
    _defaults_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_defaults_in_child)


@atexit.register
def _close_defaults() -> None:
    with _defaults_lock:
        for c in _defaults.values():
            # Exiting: a connection closed unclean is all that can be lost.
            with contextlib.suppress(Exception):
                c.close()
        _defaults.clear()
