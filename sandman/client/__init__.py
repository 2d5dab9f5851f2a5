"""The Sandman client SDK (asyncio; `sandman.client.sync` wraps it for plain code).

from sandman.client import SandmanClient, Sandbox

async with SandmanClient(namespace="rl") as client:
    async with await Sandbox.create(client, image) as sb:
        result = await sb.exec(["python3", "-m", "pytest", "-x"], cwd="/work/repo")
"""

from __future__ import annotations

from sandman.client.client import ClientState, SandmanClient
from sandman.client.errors import (
    ClientClosed,
    DaemonError,
    ProtocolError,
    ResponseTooLarge,
    SandboxGone,
    SandboxStartError,
    SandmanError,
    StreamAborted,
    TransportError,
    Unauthorized,
)
from sandman.client.pty import Terminal
from sandman.client.results import ExecResult, Process, Session
from sandman.client.sandbox import Sandbox, Timings
from sandman.client.transport import MockResponse, MockTransport

__all__ = [
    "ClientClosed",
    "ClientState",
    "DaemonError",
    "ExecResult",
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
]
