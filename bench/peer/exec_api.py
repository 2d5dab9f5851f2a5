"""The peer's first command: the apiserver's exec, the path its RL example takes.

The peer's RL handles run commands "router-free" with the Kubernetes client's
``stream(connect_get_namespaced_pod_exec, ...)`` (apiserver -> kubelet ->
runtime). That client is synchronous; each call runs on a thread of a pool
sized for the widest row, so concurrent execs are not queued behind a
default executor's few workers. ``stream()`` swaps its API client's request
function for the call, so each thread has a client of its own (the peer's
handles say the same of a shared one).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes.client import CoreV1Api
from kubernetes.stream import stream

from sandman.harness.kube import api_client


@dataclass
class ApiExec:
    kubeconfig: Path
    workers: int = 64
    _pool: ThreadPoolExecutor = field(init=False)
    _local: threading.local = field(init=False)

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="peer-exec")
        self._local = threading.local()

    def _core(self) -> CoreV1Api:
        core = getattr(self._local, "core", None)
        if core is None:
            core = self._local.core = CoreV1Api(api_client(self.kubeconfig))
        return core

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self, namespace: str, pod: str, command: list[str]) -> str:
        return stream(
            self._core().connect_get_namespaced_pod_exec,
            pod,
            namespace,
            command=command,
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
        )

    async def run(self, namespace: str, pod: str, command: list[str]) -> str:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._run, namespace, pod, command)
