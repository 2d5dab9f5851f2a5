"""SWE-ReX's runtime interface over one Sandman sandbox (see ``sandman.adapters.swerex``).

Mapping (docs/adapters.md has the differences a user can notice):

- ``create_session``/``run_in_session``/``close_session``: the daemon's shell
  sessions (``cd`` and ``export`` persist). A run's stderr is merged into its
  output in order, as SWE-ReX's pty does, by running ``{ CMD\\n} 2>&1``.
- ``BashAction``: ``bash -n`` first (``BashIncorrectSyntaxError``, nothing
  run), a timeout raises ``CommandTimeoutError`` (the daemon has already
  killed what the run started and kept the shell, so ``BashInterruptAction``
  has nothing left to interrupt), ``check`` is honoured.
- ``execute``: the daemon's exec; ``read_file``/``write_file``/``upload``: the
  file and tar API.
"""

from __future__ import annotations

import asyncio
import io
import logging
import shlex
import tarfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (
    AbstractRuntime,
    BashAction,
    BashInterruptAction,
    BashObservation,
    CloseBashSessionRequest,
    CloseBashSessionResponse,
    CloseResponse,
    Command,
    CommandResponse,
    CreateBashSessionRequest,
    CreateBashSessionResponse,
    IsAliveResponse,
    ReadFileRequest,
    ReadFileResponse,
    UploadRequest,
    UploadResponse,
    WriteFileRequest,
    WriteFileResponse,
)

from sandman.adapters.loop import LoopClient
from sandman.adapters.shell import merged
from sandman.client import DaemonError, ExecResult, Sandbox, SandmanError, Session

T = TypeVar("T")
# SWE-ReX's ``timeout=None`` means "no limit"; the daemon needs a number.
# An hour covers the slowest step SWE-agent runs (a test suite or a package
# install) while still ending a command that hangs forever.
DEFAULT_COMMAND_TIMEOUT_S = 3600.0
# `bash -n` parses and runs nothing: a second is plenty even for a long heredoc.
SYNTAX_CHECK_TIMEOUT_S = 30.0
# The syntax check runs the sandbox's bash if it has one, else its sh (the
# daemon's sessions make the same choice).
SYNTAX_CHECK = [
    "/bin/sh",
    "-c",
    "if command -v bash >/dev/null 2>&1; then exec bash -n; else exec sh -n; fi",
]


def exec_argv(command: Command) -> str | list[str]:
    """What the daemon's exec runs for a SWE-ReX Command (subprocess.run's rules)."""
    cmd = command.command
    if command.shell:
        text = cmd if isinstance(cmd, str) else shlex.join(cmd)
        return merged(text) if command.merge_output_streams else text
    argv = [cmd] if isinstance(cmd, str) else list(cmd)
    if command.merge_output_streams:
        return ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh", *argv]
    return argv


def syntax_error(command: str, result: ExecResult) -> BashIncorrectSyntaxError:
    msg = (
        f"Error (exit code {result.exit_code}) while checking bash command \n{command!r}\n"
        f"---- Stderr ----\n{result.stderr}\n---- Stdout ----\n{result.stdout}"
    )
    return BashIncorrectSyntaxError(
        msg, extra_info={"bash_stdout": result.stdout, "bash_stderr": result.stderr}
    )


def observation(action: BashAction, result: ExecResult) -> BashObservation:
    """A finished run as SWE-ReX reports it; raises what SWE-agent reacts to."""
    output = result.stdout
    if result.timed_out:
        raise CommandTimeoutError(
            f"timeout after {action.timeout} seconds while running command {action.command!r}"
        )
    if action.check == "ignore":
        return BashObservation(output=output, exit_code=None)
    if action.check == "raise" and result.exit_code != 0:
        msg = (
            f"Command {action.command!r} failed with exit code {result.exit_code}. "
            f"Here is the output:\n{output!r}"
        )
        raise NonZeroExitCodeError(f"{action.error_msg}: {msg}" if action.error_msg else msg)
    return BashObservation(output=output, exit_code=result.exit_code)


def command_response(command: Command, result: ExecResult) -> CommandResponse:
    if result.timed_out:
        raise CommandTimeoutError(f"Timeout ({command.timeout}s) exceeded while running command")
    r = CommandResponse(stdout=result.stdout, stderr=result.stderr, exit_code=result.exit_code)
    if command.check and result.exit_code != 0:
        msg = (
            f"Command {command.command!r} failed with exit code {result.exit_code}. "
            f"Stdout:\n{r.stdout!r}\nStderr:\n{r.stderr!r}"
        )
        raise NonZeroExitCodeError(f"{command.error_msg}: {msg}" if command.error_msg else msg)
    return r


def tar_of(directory: Path) -> bytes:
    """A tar of the directory's contents (members relative to it): extracted
    into the target, the target becomes a copy of the directory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for child in sorted(directory.iterdir()):
            tar.add(child, arcname=child.name)
    return buf.getvalue()


class SandmanRuntime(AbstractRuntime):
    """SWE-ReX's runtime calls on one sandbox.

    Named sessions live in a dict on the caller's side; the failure it
    guards against is two ``create_session`` calls racing to the same name
    (both would open a daemon session, one would leak): the name is
    reserved before the daemon call, under a lock, and released if the call
    fails. Safe for concurrent calls from any loop or thread; runs of one
    session are serialised by the daemon.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        connection: LoopClient,
        *,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT_S,
        logger: logging.Logger | None = None,
    ) -> None:
        self.sandbox = sandbox
        self._conn = connection
        self._command_timeout = command_timeout
        self.logger = logger or logging.getLogger(__name__)
        self._sessions: dict[str, Session | None] = {}  # None: being created

    def _call(self, coro: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        return self._conn.call(coro)

    def _timeout(self, timeout: float | None) -> float:
        return self._command_timeout if timeout is None else timeout

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        try:
            async with asyncio.timeout(timeout):
                await self._call(self.sandbox.status())
        except (SandmanError, TimeoutError, OSError) as e:
            return IsAliveResponse(is_alive=False, message=f"{type(e).__name__}: {e}")
        return IsAliveResponse(is_alive=True)

    # -- sessions ----------------------------------------------------------------
    async def create_session(self, request: CreateBashSessionRequest) -> CreateBashSessionResponse:
        # MUST reserve the name before the daemon call: a second create of the
        # same name during the call would otherwise open a second shell.
        if request.session in self._sessions:
            raise SessionExistsError(f"session {request.session} already exists")
        self._sessions[request.session] = None
        try:
            session = await self._call(self.sandbox.session())
            output = ""
            for path in request.startup_source:
                r = await self._call(
                    session.run(merged(f"source {shlex.quote(path)}"), timeout_s=60.0)
                )
                output += r.stdout
        except BaseException:
            self._sessions.pop(request.session, None)
            raise
        self._sessions[request.session] = session
        return CreateBashSessionResponse(output=output)

    def _session(self, name: str) -> Session:
        session = self._sessions.get(name)
        if session is None:
            raise SessionDoesNotExistError(f"session {name!r} does not exist")
        return session

    async def run_in_session(self, action: BashAction | BashInterruptAction) -> BashObservation:
        session = self._session(action.session)
        if isinstance(action, BashInterruptAction):
            # A timed-out run was already killed by the daemon; the shell is at its prompt.
            return BashObservation(output="", exit_code=0)
        if action.is_interactive_command or action.is_interactive_quit or action.expect:
            raise NotImplementedError(
                "interactive commands (is_interactive_command, is_interactive_quit, expect) "
                "need a terminal; Sandman's shell sessions have none"
            )
        check = await self._call(
            self.sandbox.exec(SYNTAX_CHECK, stdin=action.command, timeout_s=SYNTAX_CHECK_TIMEOUT_S)
        )
        if check.exit_code != 0:
            raise syntax_error(action.command, check)
        result = await self._call(
            session.run(merged(action.command), timeout_s=self._timeout(action.timeout))
        )
        return observation(action, result)

    async def close_session(self, request: CloseBashSessionRequest) -> CloseBashSessionResponse:
        session = self._session(request.session)
        del self._sessions[request.session]
        await self._close(session)
        return CloseBashSessionResponse()

    async def _close(self, session: Session) -> None:
        try:
            await self._call(session.close())
        except DaemonError as e:
            if e.status != 404:  # already gone (ended by `exit`, or a reset): done
                raise

    # -- one-off commands and files ------------------------------------------------------
    async def execute(self, command: Command) -> CommandResponse:
        result = await self._call(
            self.sandbox.exec(
                exec_argv(command),
                cwd=command.cwd,
                env=command.env,
                timeout_s=self._timeout(command.timeout),
            )
        )
        return command_response(command, result)

    async def read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        try:
            data = await self._call(self.sandbox.read_file(request.path))
        except DaemonError as e:
            if e.status == 404:
                raise FileNotFoundError(f"{request.path}: {e.message}") from None
            raise
        return ReadFileResponse(
            content=data.decode(request.encoding or "utf-8", request.errors or "strict")
        )

    async def write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        await self._call(self.sandbox.write_file(request.path, request.content, mkdirs=True))
        return WriteFileResponse()

    async def upload(self, request: UploadRequest) -> UploadResponse:
        source = Path(request.source_path)
        if source.is_dir():
            await self._call(self.sandbox.upload_tar(request.target_path, tar_of(source)))
        elif source.is_file():
            data = source.read_bytes()
            mode = f"{source.stat().st_mode & 0o777:04o}"
            await self._call(self.sandbox.write_file(request.target_path, data, mode=mode))
        else:
            raise FileNotFoundError(f"upload source {request.source_path} does not exist")
        return UploadResponse()

    async def close(self) -> CloseResponse:
        """Close every session (the sandbox itself is the deployment's to release)."""
        sessions = [s for s in self._sessions.values() if s is not None]
        self._sessions.clear()
        errors = []
        for session in sessions:
            try:
                await self._close(session)
            except (SandmanError, OSError) as e:
                errors.append(e)
        if errors:
            self.logger.warning("closing %d session(s) failed: %s", len(errors), errors[0])
        return CloseResponse()
