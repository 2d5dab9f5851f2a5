"""Typed results and handles: exec results, shell sessions, background processes."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandman.client.sandbox import Sandbox


def decode_output(text: str, encoding: str) -> bytes:
    return base64.b64decode(text) if encoding == "base64" else text.encode()


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout_bytes: bytes
    stderr_bytes: bytes
    timed_out: bool
    truncated: bool
    duration_ms: float
    cwd: str | None = None

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode(errors="replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ExecResult:
        return cls(
            exit_code=int(doc["exit_code"]),
            stdout_bytes=decode_output(doc.get("stdout", ""), doc.get("stdout_encoding", "utf-8")),
            stderr_bytes=decode_output(doc.get("stderr", ""), doc.get("stderr_encoding", "utf-8")),
            timed_out=bool(doc.get("timed_out")),
            truncated=bool(doc.get("truncated")),
            duration_ms=float(doc.get("duration_ms", 0.0)),
            cwd=doc.get("cwd"),
        )


@dataclass
class Session:
    """A persistent shell in the sandbox: `cd` and `export` carry over between runs."""

    sandbox: Sandbox
    id: str

    async def run(
        self, cmd: str, *, timeout_s: float = 600.0, stdin: str | None = None
    ) -> ExecResult:
        body: dict[str, Any] = {"cmd": cmd, "timeout_s": timeout_s}
        if stdin is not None:
            body["stdin"] = stdin
        doc = await self.sandbox._call(
            "POST", f"/v1/sessions/{self.id}/run", body=body, timeout=timeout_s + 30
        )
        return ExecResult.from_json(doc)

    async def close(self) -> None:
        await self.sandbox._call("DELETE", f"/v1/sessions/{self.id}")


@dataclass(frozen=True)
class OutputPage:
    """One read of a background process's output (daemon/API.md)."""

    data: bytes
    offset: int  # where ``data`` starts (later than asked if that fell out of the ring)
    next_offset: int  # read on from here
    end: int  # bytes written so far
    dropped: int  # bytes lost before ``offset``
    running: bool
    exit_code: int | None


@dataclass
class Process:
    """A background process; its output can be re-read from any offset."""

    sandbox: Sandbox
    id: str
    pid: int
    record: dict[str, Any] = field(default_factory=dict)  # as listed (name, cmd, ...)

    async def info(self) -> dict[str, Any]:
        return await self.sandbox._call("GET", f"/v1/processes/{self.id}")  # type: ignore[no-any-return]

    async def output(
        self, *, offset: int = 0, stream: str = "combined", wait_s: float = 0.0
    ) -> tuple[bytes, int]:
        """(data from ``offset``, the next offset to read from)."""
        doc = await self.sandbox._call(
            "GET",
            f"/v1/processes/{self.id}/output",
            params={"offset": str(offset), "stream": stream, "wait_s": str(wait_s)},
            timeout=wait_s + 30,
        )
        return decode_output(doc["data"], doc["encoding"]), int(doc["next_offset"])

    async def read(
        self, *, offset: int = 0, stream: str = "combined", wait_s: float = 0.0
    ) -> OutputPage:
        """Output from ``offset``; ``wait_s`` waits for output past it (or the end)."""
        doc = await self.sandbox._call(
            "GET",
            f"/v1/processes/{self.id}/output",
            params={"offset": str(offset), "stream": stream, "wait_s": str(wait_s)},
            timeout=wait_s + 30,
        )
        return OutputPage(
            data=decode_output(doc["data"], doc["encoding"]),
            offset=int(doc["offset"]),
            next_offset=int(doc["next_offset"]),
            end=int(doc["end"]),
            dropped=int(doc.get("dropped", 0)),
            running=bool(doc["running"]),
            exit_code=doc.get("exit_code"),
        )

    async def write(self, data: str | bytes, *, eof: bool = False) -> None:
        """Send ``data`` to the process's stdin (bytes go as base64, any content)."""
        body: dict[str, Any] = {"data": data, "eof": eof}
        if isinstance(data, bytes):
            body["data"], body["encoding"] = base64.b64encode(data).decode(), "base64"
        await self.sandbox._call("POST", f"/v1/processes/{self.id}/stdin", body=body)

    async def signal(self, sig: str | int = "TERM") -> None:
        await self.sandbox._call("POST", f"/v1/processes/{self.id}/signal", body={"signal": sig})

    async def wait(self, timeout_s: float = 30.0) -> dict[str, Any]:
        return await self.sandbox._call(  # type: ignore[no-any-return]
            "POST",
            f"/v1/processes/{self.id}/wait",
            body={"timeout_s": timeout_s},
            timeout=timeout_s + 30,
        )

    async def kill(self) -> None:
        await self.sandbox._call("DELETE", f"/v1/processes/{self.id}")
