"""The Sandman client SDK, asyncio. ``from sandman import Sandbox`` (the module
``sandman.client.sync``) is the same SDK with blocking calls.

from sandman.client import SandmanClient, Sandbox

async with SandmanClient(namespace="rl") as client:
    async with await Sandbox.create(client, image) as sb:
        result = await sb.exec(["python3", "-m", "pytest", "-x"], cwd="/work/repo")
"""

from __future__ import annotations

from sandman.client.client import ClientState, SandmanClient
from sandman.client.errors import (
    ClientClosed,
    ConfigError,
    DaemonError,
    KubernetesError,
    ProtocolError,
    ResponseTooLarge,
    SandboxGone,
    SandboxStartError,
    SandmanError,
    StreamAborted,
    TransportError,
    Unauthorized,
    WaitTimeout,
)
from sandman.client.pty import Terminal
from sandman.client.results import ExecResult, Process, Session
from sandman.client.sandbox import Sandbox, Timings
from sandman.client.transport import MockResponse, MockTransport

__all__ = [
    "ClientClosed",
    "ClientState",
    "ConfigError",
    "DaemonError",
    "ExecResult",
    "KubernetesError",
    "MockResponse",
    "MockTransport",
    "Process",
    "ProtocolError",
    "ResponseTooLarge",
    "Sandbox",
    "SandboxGone",
    "SandboxStartError",
    "SandmanClient",
    "SandmanError",
    "Session",
    "StreamAborted",
    "Terminal",
    "Timings",
    "TransportError",
    "Unauthorized",
    "WaitTimeout",
]
