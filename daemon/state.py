"""The daemon's runtime state: one object per app, created by the app factory."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sandman.daemon import __version__
from sandman.daemon.background import BackgroundProcesses
from sandman.daemon.children import Child, ChildReaper, kill_tree, spawn
from sandman.daemon.commands import ExecResult
from sandman.daemon.config import DaemonConfig
from sandman.daemon.metrics import DaemonMetrics
from sandman.daemon.paths import PathPolicy
from sandman.daemon.readiness import SharedCheck
from sandman.daemon.sessions import Sessions
from sandman.daemon.status import Activity

if TYPE_CHECKING:  # reset's modules are imported only when a reset or record runs
    from sandman.daemon.pristine import Pristine

log = logging.getLogger("sandmand")


@dataclass
class DaemonState:
    config: DaemonConfig
    base_env: dict[str, str]
    reaper: ChildReaper
    sessions: Sessions
    background: BackgroundProcesses
    policy: PathPolicy
    metrics: DaemonMetrics
    activity: Activity
    version: str = __version__
    pristine: Pristine | None = None
    pristine_key: bytes = b""  # HMAC key of the record on disk (reset.prepare)
    started: bool = False  # startup finished (pristine recorded, command started)
    terminals: int = 0  # /v1/pty sessions open now
    stopping: bool = False
    # Set by SIGTERM/SIGINT, or by the supervised command's exit under
    # --exit-with-command (then command_finished is True too).
    stop_requested: asyncio.Event | None = None
    command_finished: bool = False
    supervised: Child | None = None
    supervised_exit: int | None = None
    reset_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    readiness: SharedCheck = field(default_factory=SharedCheck)  # /readyz: once per period

    def count_command(self, result: ExecResult) -> None:
        self.metrics.commands.inc("timeout" if result.timed_out else "ok")

    # -- the image's own command, supervised ------------------------------------
    def start_supervised(self) -> None:
        if not self.config.command:
            return
        try:
            # Its output goes to the container's log, as without the daemon.
            child = spawn(self.reaper, self.config.command, env=self.base_env, capture=False)
        except OSError as e:
            log.error("cannot start the original command %s: %s", self.config.command, e)
            self.supervised_exit = 127
            if self.config.exit_with_command:
                self.command_finished = True
                if self.stop_requested is not None:
                    self.stop_requested.set()
            return
        self.supervised, self.supervised_exit = child, None

        def ended(f: asyncio.Future[int]) -> None:
            if self.supervised is child and not f.cancelled():
                self.supervised_exit = f.result()
                log.info("original command exited with %s", self.supervised_exit)
                if self.config.exit_with_command and not self.stopping:
                    self.command_finished = True
                    if self.stop_requested is not None:
                        self.stop_requested.set()

        child.exited.add_done_callback(ended)

    async def stop_supervised(self) -> None:
        child = self.supervised
        if child is not None and not child.exited.done():
            kill_tree(child.pid)
            with contextlib.suppress(asyncio.CancelledError):
                await child.exited

    async def restart_supervised(self) -> None:
        await self.stop_supervised()
        self.start_supervised()

    def supervised_info(self) -> dict[str, Any] | None:
        if not self.config.command:
            return None
        child = self.supervised
        return {
            "cmd": list(self.config.command),
            "pid": child.pid if child else None,
            "running": child is not None and not child.exited.done(),
            "exit_code": self.supervised_exit,
        }


def scratch_dir(config: DaemonConfig) -> str:
    return os.path.join(str(config.daemon_dir), "run")
