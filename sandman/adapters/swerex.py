"""SWE-ReX on Sandman: a deployment whose runtime is a Sandman sandbox.

Needs the ``[swerex]`` extra (swe-rex 1.4.0, the version this is tested
against). Use it wherever SWE-ReX takes a deployment, SWE-agent included:

    from sandman.adapters.swerex import SandmanDeployment

    deployment = SandmanDeployment(image="127.0.0.1:5000/sandman/swe:1", namespace="rl")
    await deployment.start()
    print(await deployment.runtime.execute(Command(command=["echo", "hi"])))
    await deployment.stop()

    # SWE-agent: SWEEnv(deployment=SandmanDeployment(...), repo=..., post_startup_commands=[])
    # or SandmanDeploymentConfig(image=...).get_deployment()

No SWE-ReX server runs in the sandbox: sessions are the daemon's shell
sessions, ``execute`` is the daemon's exec, files and uploads go through the
file and tar API, ``stop`` releases the sandbox. docs/adapters.md lists what
differs from SWE-ReX's local runtime.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
from swerex.exceptions import DeploymentNotStartedError, DeploymentStartupError
from swerex.runtime.abstract import IsAliveResponse

from sandman.adapters.loop import LoopClient
from sandman.adapters.swerex_runtime import DEFAULT_COMMAND_TIMEOUT_S, SandmanRuntime
from sandman.client import Sandbox, SandboxStartError

log = logging.getLogger(__name__)


class SandmanDeploymentConfig(BaseModel):
    """SWE-ReX-style config of a Sandman sandbox (``type: "sandman"``).

    SWE-agent's own ``EnvironmentConfig.deployment`` is a closed union that
    turns an unknown ``type`` into a Daytona config without an error, so a
    YAML file cannot select Sandman; build the deployment from this config
    in Python and hand it to ``SWEEnv(deployment=...)`` (docs/adapters.md).
    """

    type: Literal["sandman"] = "sandman"
    """Discriminator for (de)serialization. Do not change."""
    image: str
    namespace: str = "default"
    kubeconfig: str | None = None
    transport: Literal["auto", "direct", "proxy"] = "auto"
    command: list[str] | None = None
    """The container's command; None keeps the image's (the daemon serves either way)."""
    env: dict[str, str] = {}
    resources: dict[str, Any] | None = None
    ttl: str = "2h"
    """The sandbox's lease; the reaper reclaims it after this even if stop() never runs."""
    idle_timeout: str | None = None
    node_selector: dict[str, str] | None = None
    labels: dict[str, str] = {}
    startup_timeout: float = 300.0
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT_S
    """Used where SWE-ReX passes ``timeout=None`` (no limit there)."""

    model_config = ConfigDict(extra="forbid")

    def get_deployment(self) -> SandmanDeployment:
        return SandmanDeployment.from_config(self)


class SandmanDeployment(AbstractDeployment):
    """One Sandman sandbox as a SWE-ReX deployment.

    The failure it prevents: SWE-agent calls every method through a fresh
    ``asyncio.run``, and an SDK client opened on one of those loops is dead
    on the next. All sandbox calls therefore run on a ``LoopClient`` thread
    (owned, or shared via ``connection=`` to pool connections across many
    deployments). ``stop`` is idempotent and safe from ``__del__``. Not
    meant for concurrent ``start``/``stop`` calls; runtime calls may overlap.
    """

    def __init__(
        self,
        *,
        connection: LoopClient | None = None,
        logger: logging.Logger | None = None,
        **kwargs: Any,
    ) -> None:
        self._config = SandmanDeploymentConfig(**kwargs)
        self.logger = logger or log
        self._hooks = CombinedDeploymentHook()
        self._connection = connection
        self._owns_connection = connection is None
        self._sandbox: Sandbox | None = None
        self._runtime: SandmanRuntime | None = None

    @classmethod
    def from_config(cls, config: SandmanDeploymentConfig) -> SandmanDeployment:
        return cls(**config.model_dump(exclude={"type"}))

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    @property
    def sandbox(self) -> Sandbox:
        """The Sandman sandbox behind the runtime (for calls SWE-ReX has no name for)."""
        if self._sandbox is None:
            raise DeploymentNotStartedError()
        return self._sandbox

    @property
    def runtime(self) -> SandmanRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        return await self.runtime.is_alive(timeout=timeout)

    async def start(self) -> None:
        if self._runtime is not None:
            self.logger.warning("deployment already started; ignoring start()")
            return
        cfg = self._config
        if self._connection is None:
            self._connection = LoopClient(
                kubeconfig=cfg.kubeconfig, namespace=cfg.namespace, transport=cfg.transport
            )
        conn = self._connection
        self._hooks.on_custom_step("Starting sandbox")
        self.logger.info("starting a sandbox from %s", cfg.image)
        try:
            sb = await conn.call(
                Sandbox.create(
                    conn.client,
                    cfg.image,
                    namespace=cfg.namespace,
                    command=cfg.command,
                    env=cfg.env,
                    resources=cfg.resources,
                    ttl=cfg.ttl,
                    idle_timeout=cfg.idle_timeout,
                    node_selector=cfg.node_selector,
                    labels=cfg.labels,
                    timeout_s=cfg.startup_timeout,
                )
            )
        except SandboxStartError as e:
            raise DeploymentStartupError(
                f"sandbox did not start: {e} (retryable={e.retryable})"
            ) from e
        self._sandbox = sb
        self._runtime = SandmanRuntime(
            sb, conn, command_timeout=cfg.command_timeout, logger=self.logger
        )
        self._hooks.on_custom_step("Sandbox ready")
        self.logger.info("sandbox %s/%s ready", sb.namespace, sb.name)

    async def stop(self) -> None:
        """Close sessions, release the sandbox, close an owned connection."""
        runtime, sb, conn = self._runtime, self._sandbox, self._connection
        self._runtime = self._sandbox = None
        try:
            if runtime is not None:
                await runtime.close()
        finally:
            try:
                if sb is not None and conn is not None:
                    await conn.call(sb.release())
            finally:
                if self._owns_connection and conn is not None:
                    self._connection = None
                    conn.close()
