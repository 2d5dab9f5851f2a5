"""Running one command to completion: timeout, output caps, streaming."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sandman.contract import ENV_TMPDIR_ORIG
from sandman.daemon.children import Child, ChildReaper, kill_tree, spawn
from sandman.daemon.errors import BadRequest
from sandman.daemon.output import Capture, encode, feed, pump
from sandman.daemon.requests import ExecRequest

# Our own secrets: never passed to commands.
SCRUBBED_PREFIXES = ("SANDMAN_TOKEN",)


def base_environment(env: Mapping[str, str], daemon_dir: str = "/.sandman") -> dict[str, str]:
    """The container's environment as the image defined it, for commands.

    Passed on unchanged, LD_LIBRARY_PATH, PYTHONPATH and PYTHONHOME included:
    the runtime tree sets none of them (the daemon finds its libraries through
    DT_RPATH and ignores PYTHON* with -I), so whatever is there is the image's
    and its commands need it. Removed: the token's hash (ours). A TMPDIR inside
    the daemon's directory (what webhooks before the runtime tree set, with
    the image's value kept in SANDMAN_TMPDIR_ORIG) is handed back as the
    image's own value: commands cannot write into the daemon's directory.
    """
    out = {
        k: v for k, v in env.items() if not k.startswith(SCRUBBED_PREFIXES) and k != ENV_TMPDIR_ORIG
    }
    own = daemon_dir.rstrip("/")
    tmpdir = env.get("TMPDIR")
    if tmpdir is not None and (tmpdir == own or tmpdir.startswith(own + "/")):
        del out["TMPDIR"]
        if env.get(ENV_TMPDIR_ORIG):
            out["TMPDIR"] = env[ENV_TMPDIR_ORIG]
    out.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return out


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    truncated: bool
    duration_ms: float

    def to_json(self) -> dict[str, Any]:
        out, out_enc = encode(self.stdout, truncated=self.truncated)
        err, err_enc = encode(self.stderr, truncated=self.truncated)
        return {
            "exit_code": self.exit_code,
            "stdout": out,
            "stderr": err,
            "stdout_encoding": out_enc,
            "stderr_encoding": err_enc,
            "timed_out": self.timed_out,
            "truncated": self.truncated,
            "duration_ms": round(self.duration_ms, 3),
        }


def start_error(argv: tuple[str, ...], cwd: str | None, e: OSError) -> BadRequest:
    if argv[:2] == ("/bin/sh", "-c") and e.filename in ("/bin/sh", None):
        return BadRequest(
            "this image has no /bin/sh for a shell string; pass cmd as an argv list",
            code="no_shell",
        )
    if cwd and not os.path.isdir(cwd):
        return BadRequest(f"cwd {cwd!r} is not a directory", code="bad_cwd")
    what = f" ({e.filename})" if e.filename and e.filename != argv[0] else ""
    return BadRequest(f"cannot start {argv[0]!r}: {e.strerror}{what}", code="cannot_start")


async def wait_exit(
    child: Child, pumps: list[asyncio.Future[None]], timeout_s: float
) -> tuple[int, bool]:
    """(exit code, timed out). A pump that fails (its client went away) raises
    here at once, not when the command happens to end."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pending: set[asyncio.Future[Any]] = {child.exited, *pumps}
    while not child.exited.done():
        remaining = deadline - loop.time()
        if remaining <= 0:
            kill_tree(child.pid)
            return await child.exited, True
        done, pending = await asyncio.wait(
            pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
        )
        for t in done:
            if t is not child.exited and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
    return child.exited.result(), False


async def run_command(
    reaper: ChildReaper,
    req: ExecRequest,
    base_env: Mapping[str, str],
    on_chunk: Callable[[str, bytes], Awaitable[None]] | None = None,
    on_started: Callable[[], Awaitable[None]] | None = None,
) -> ExecResult:
    """Run to completion. ``on_chunk(stream, data)`` sees output as it comes
    (streaming); the pipe is read only as fast as it returns. Captures keep at
    most ``max_output_bytes`` per stream. ``on_started()`` is awaited once the
    command has started, before any output: a streamed answer begins there, so
    a command that cannot start is still a plain 4xx (cannot_start, bad_cwd)."""
    env = {**base_env, **req.env}
    t0 = time.monotonic()
    try:
        child = spawn(reaper, req.argv, cwd=req.cwd, env=env, stdin=req.stdin is not None)
    except OSError as e:
        raise start_error(req.argv, req.cwd, e) from None
    if on_started is not None:
        try:
            await on_started()
        except BaseException:
            kill_tree(child.pid)  # nobody will read it
            raise
    out, err = Capture(req.max_output_bytes), Capture(req.max_output_bytes)

    def sink(name: str, cap: Capture) -> Callable[[bytes], Awaitable[None] | None]:
        if on_chunk is None:
            return cap

        def both(data: bytes) -> Awaitable[None]:
            cap(data)
            return on_chunk(name, data)

        return both

    assert child.stdout is not None and child.stderr is not None
    pumps = [
        asyncio.ensure_future(pump(child.stdout, sink("stdout", out), child.exited)),
        asyncio.ensure_future(pump(child.stderr, sink("stderr", err), child.exited)),
    ]
    writer = None
    if req.stdin is not None and child.stdin is not None:
        writer = asyncio.ensure_future(feed(child.stdin, req.stdin))
    try:
        code, timed_out = await wait_exit(child, pumps, req.timeout_s)
        await asyncio.gather(*pumps)  # they stop by themselves: EOF, or linger after exit
    except BaseException:
        # The client went away (cancelled, or a streamed write failed): nobody
        # will read the result, so the command (and all it started) goes too.
        kill_tree(child.pid)
        for p in pumps:
            p.cancel()
        raise
    finally:
        if writer is not None and not writer.done():
            writer.cancel()
        for p in pumps:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await p
    return ExecResult(
        exit_code=code,
        stdout=out.value(),
        stderr=err.value(),
        timed_out=timed_out,
        truncated=out.truncated or err.truncated,
        duration_ms=(time.monotonic() - t0) * 1000,
    )
