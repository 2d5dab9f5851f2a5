"""Run a real `sandmand serve` process for tests, and talk to it.

Process semantics (reaping, process groups, reset killing everything) are
tested against a daemon subprocess: in-process, its reaper and reset would
act on the test runner's own children (the session cluster among them).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandman.harness.testing import free_port

TOKEN = "test-token-0123456789"
TOKEN_SHA256 = hashlib.sha256(TOKEN.encode()).hexdigest()


@dataclass
class Daemon:
    """A `sandmand serve` subprocess and a minimal HTTP client for it."""

    port: int
    proc: subprocess.Popen[bytes]
    root: Path
    token: str = TOKEN
    _conn: http.client.HTTPConnection | None = field(default=None, repr=False)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        token: str | None = None,
        timeout: float = 60,
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token if token is not None else self.token}"}
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
        finally:
            conn.close()
        ctype = resp.getheader("Content-Type", "")
        if ctype.startswith("application/json"):
            return resp.status, json.loads(payload)
        return resp.status, payload

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, doc = self.request(method, path, body, **kw)
        assert 200 <= status < 300, (status, doc)
        return doc

    def exec(self, cmd: Any, **fields: Any) -> dict[str, Any]:
        return self.ok("POST", "/v1/exec", {"cmd": cmd, **fields})


def start_daemon(
    root: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    wrapper: tuple[str, ...] = (),
) -> Daemon:
    """``wrapper``: a command that execs the daemon (e.g. setpriv, dropping
    capabilities for the daemon and so for everything it runs)."""
    port = free_port()
    (root / "d").mkdir(parents=True, exist_ok=True)
    argv = [
        *wrapper,
        sys.executable,
        "-m",
        "sandman.daemon",
        "serve",
        f"--listen=127.0.0.1:{port}",
        f"--token-sha256={TOKEN_SHA256}",
        f"--daemon-dir={root / 'd'}",
        "--grace=2",
        # Not the host's Python trees (the image's, in a sandbox): tests that
        # check them pass their own.
        "--python-dirs=none",
        *extra,
    ]
    proc = subprocess.Popen(
        argv,
        cwd=root,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    d = Daemon(port, proc, root)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited: {proc.stdout.read().decode()}")  # type: ignore[union-attr]
        try:
            if d.request("GET", "/healthz")[0] == 200:
                return d
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("daemon did not answer /healthz")


def stop_daemon(d: Daemon) -> None:
    if d.proc.poll() is None:
        d.proc.terminate()
        try:
            d.proc.wait(10)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout
