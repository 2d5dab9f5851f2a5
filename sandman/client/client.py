"""The SDK's client: shared connection pools, credentials and access keys.

Create one per process (or per event loop) and pass it to every Sandbox:

    async with SandmanClient(namespace="rl") as client:
        async with await Sandbox.create(client, "127.0.0.1:5000/sandman/swe:1") as sb:
            print((await sb.exec("python3 -m unittest")).exit_code)
"""

from __future__ import annotations

import asyncio
import enum
import time
from pathlib import Path
from typing import Any

from sandman import tokens
from sandman.client.edges import sdk_errors, translated
from sandman.client.errors import ClientClosed
from sandman.client.podwatch import PodWatch
from sandman.client.transport import MAX_PER_SANDBOX, HttpTransport, Transport
from sandman.kube_async import SECRETS, ApiError, KubeClient
from sandman.telemetry import Telemetry

# The webhook publishes a new namespace's access key within a second or so;
# waiting up to 10 s covers a busy control plane.
ACCESS_KEY_WAIT_S = 10.0


class ClientState(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class _Unset:
    """Sentinel: "not given" (as opposed to None, which may mean "none")."""


UNSET: Any = _Unset()


class SandmanClient:
    """Holds the Kubernetes client, the daemon transport and per-namespace keys.

    Safe for concurrent use by the tasks of one event loop; not thread-safe
    (the sync wrapper runs it on its own loop thread). Using it after
    ``close()`` raises ClientClosed instead of failing somewhere deep.
    """

    def __init__(
        self,
        *,
        kubeconfig: Path | str | None = None,
        context: str | None = None,
        namespace: str | None = None,
        transport: Transport | str = "auto",
        kube: KubeClient | None = None,
        access_keys: dict[str, bytes] | None = None,
        telemetry: Telemetry | None = None,
        max_per_sandbox: int = MAX_PER_SANDBOX,
    ) -> None:
        """``kubeconfig``/``context`` as kubectl's flags (None: $KUBECONFIG,
        ~/.kube/config, else in-cluster); ``namespace`` None: the context's
        namespace, as kubectl does (in a pod: the pod's). ``max_per_sandbox``:
        direct connections kept open to one sandbox (concurrent streams)."""
        # Traces and the pool metrics endpoint, as OTEL_*/SANDMAN_METRICS_LISTEN
        # say (off by default, and then free): sandman.telemetry.
        self.telemetry = telemetry if telemetry is not None else Telemetry.from_env()
        if kube is None:
            with translated("SandmanClient"):  # ConfigError: no usable kubeconfig
                kube = KubeClient.from_kubeconfig(
                    kubeconfig, context=context, user_agent="sandman-sdk"
                )
        self.kube = kube
        self.namespace = namespace or self.kube.creds.namespace
        self._max_per_sandbox = max_per_sandbox
        self._transport_arg = transport
        self._transport: Transport | None = None
        # Sandboxes waiting to start share one pod watch per namespace.
        self.pod_watch = PodWatch(self.kube)
        self._keys: dict[str, bytes] = dict(access_keys or {})
        self._rings: dict[str, tokens.AccessKeys] = {}
        self._key_locks: dict[str, asyncio.Lock] = {}
        self.state = ClientState.UNOPENED

    async def __aenter__(self) -> SandmanClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @sdk_errors("SandmanClient.open")
    async def open(self) -> None:
        if self.state is ClientState.CLOSED:
            raise ClientClosed("this SandmanClient was closed; create a new one")
        if self.state is ClientState.OPEN:
            return
        self.kube.open()
        t = self._transport_arg
        self._transport = (
            HttpTransport(self.kube, t, max_per_sandbox=self._max_per_sandbox)
            if isinstance(t, str)
            else t
        )
        self.state = ClientState.OPEN
        await self.telemetry.start()

    @sdk_errors("SandmanClient.close")
    async def close(self) -> None:
        if self.state is ClientState.OPEN:
            assert self._transport is not None
            await self._transport.close()
            await self.telemetry.aclose()  # pending traces still read Events: before kube
            await self.kube.close()
        self.state = ClientState.CLOSED

    def check_open(self) -> None:
        if self.state is not ClientState.OPEN:
            raise ClientClosed(f"SandmanClient is {self.state.value}; use `async with` or open()")

    @property
    def transport(self) -> Transport:
        self.check_open()
        assert self._transport is not None
        return self._transport

    @sdk_errors("SandmanClient.namespace_key")
    async def namespace_key(self, namespace: str, key_id: str | None = None) -> bytes:
        """K_ns for sandboxes admitted under key generation ``key_id`` (None: the
        current one), from the namespace's ``sandman-access`` Secret (read by
        RBAC). A generation the cached copy lacks (a rotation) is read again;
        one that is no longer published raises ``sandman.tokens.KeyRetired``."""
        if namespace in self._keys:
            return self._keys[namespace]  # given to the constructor: one generation
        ring = self._rings.get(namespace)
        if ring is not None and (key_id is None or key_id in ring.keys):
            return ring.key_for(key_id)
        lock = self._key_locks.setdefault(namespace, asyncio.Lock())
        async with lock:
            ring = self._rings.get(namespace)
            if ring is not None and (key_id is None or key_id in ring.keys):
                return ring.key_for(key_id)
            deadline = time.monotonic() + ACCESS_KEY_WAIT_S
            while True:
                try:
                    s = await self.kube.get(SECRETS, tokens.ACCESS_SECRET, namespace)
                    ring = tokens.AccessKeys.from_secret_data(s.get("data") or {})
                    # A generation not published here yet (a rotation a moment
                    # ago) is waited for; a retired one raises below.
                    if key_id is None or key_id in ring.keys or time.monotonic() > deadline:
                        break
                except ApiError as e:
                    if not e.not_found or time.monotonic() > deadline:
                        raise
                await asyncio.sleep(0.2)
            self._rings[namespace] = ring
            return ring.key_for(key_id)

    @sdk_errors("SandmanClient.token_for")
    async def token_for(self, namespace: str, sandbox_id: str, key_id: str | None = None) -> str:
        """The token of a sandbox (``key_id``: its ``sandman.dev/key-id``)."""
        return tokens.sandbox_token(await self.namespace_key(namespace, key_id), sandbox_id)
