"""Gymnasium environments for coding tasks on Sandman sandboxes (the ``[gym]`` extra).

    from sandman.adapters.gym import SandmanEnv
    from sandman.adapters.gymtask import Task

    env = SandmanEnv("127.0.0.1:5000/sandman/swe:1", Task("fix", "Make the tests pass.",
                     check="python3 -m unittest", cwd="/work/repo"), namespace="rl")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("python3 -m unittest")

An observation is text; an action is a shell command (run in a persistent
shell: ``cd`` and ``export`` carry over), a ``FileEdit``, or ``"submit"``,
which ends the episode with the task's reward. ``reset`` reuses the
sandbox when ``/v1/reset`` verifies it pristine and its container never
restarted (a restarted daemon's record proves nothing), else it gets a new one
(claimed from a warm pool when ``pool=`` names one, or created).

Infrastructure failures are never rewards: the step returns reward 0.0,
``truncated=True`` and ``info["infra_error"]`` (with ``info["retryable"]``),
and the transition must be discarded; the next ``reset`` gets a new sandbox.
``SandmanVectorEnv`` (``gym_vector.py``) steps many of these on one loop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from sandman.adapters.gymtask import (
    CHARSET,
    Action,
    FileEdit,
    RewardFn,
    StepContext,
    Task,
    is_submit,
    observation,
    step_text,
)
from sandman.adapters.loop import LoopClient
from sandman.adapters.shell import merged
from sandman.client import (
    DaemonError,
    Sandbox,
    SandmanError,
    Session,
)
from sandman.fleet.retry import infra_failure
from sandman.kube_async import ApiError

log = logging.getLogger(__name__)

# The longest observation: about 4k tokens of terminal text, enough for a
# test run's summary; longer output keeps its end (observation()).
MAX_OBS_CHARS = 16_384
# A shell command longer than this is almost certainly a model's runaway
# generation; a file's content travels as a FileEdit, which has no limit.
MAX_ACTION_CHARS = 4_096


class SandmanEnv(gym.Env[str, Action]):
    """One sandbox, one coding task per episode.

    The failure it prevents: an RL loop scoring a crashed node or a lost
    connection as the agent's zero reward. Such errors end the episode
    with ``truncated=True`` and ``info["infra_error"]`` instead, and the
    sandbox is replaced at the next reset. ``info`` holds only what a
    seeded replay reproduces (no timings, no pod names), so
    ``gymnasium.utils.env_checker.check_env`` passes.

    Blocking calls run on a ``LoopClient`` (owned, or shared via
    ``connection=``); ``areset``/``astep`` are the same calls for code on that
    loop. Not thread-safe: one episode at a time, as any Gymnasium env.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        image: str,
        task: Task | Sequence[Task],
        *,
        namespace: str = "default",
        kubeconfig: str | None = None,
        connection: LoopClient | None = None,
        pool: str | None = None,
        reward_fn: RewardFn | None = None,
        step_timeout_s: float = 120.0,
        max_obs_chars: int = MAX_OBS_CHARS,
        max_action_chars: int = MAX_ACTION_CHARS,
        ttl: str = "2h",
        command: Sequence[str] | None = None,
        node_selector: dict[str, str] | None = None,
        resources: dict[str, Any] | None = None,
        max_attempts: int = 3,
        startup_timeout_s: float = 300.0,
    ) -> None:
        self.tasks = [task] if isinstance(task, Task) else list(task)
        if not self.tasks:
            raise ValueError("SandmanEnv needs at least one task")
        self.image, self.namespace, self.pool = image, namespace, pool
        self.reward_fn = reward_fn or check_reward
        self.step_timeout_s, self.max_obs_chars = step_timeout_s, max_obs_chars
        self.max_attempts, self.startup_timeout_s = max_attempts, startup_timeout_s
        self._pod = {"ttl": ttl, "command": command, "node_selector": node_selector,
                     "resources": resources}  # fmt: skip
        self.observation_space = spaces.Text(max_obs_chars, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(max_action_chars, min_length=1, charset=CHARSET)
        self._owns_connection = connection is None
        self.connection = connection or LoopClient(kubeconfig=kubeconfig, namespace=namespace)
        self.sandbox: Sandbox | None = None
        self._session: Session | None = None
        self._task: Task | None = None
        self._steps = 0
        self._broken: tuple[str, bool] | None = None

    # -- Gymnasium's API -----------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        return self.connection.run(self.areset(self.pick_task(options)))

    def step(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self.connection.run(self.astep(action))

    def close(self) -> None:
        try:
            if self.sandbox is not None:
                self.connection.run(self.arelease())
        finally:
            if self._owns_connection:
                self.connection.close()

    def pick_task(self, options: dict[str, Any] | None) -> Task:
        """``options["task"]`` (a Task or a task id), else one drawn with the seeded RNG."""
        chosen = (options or {}).get("task")
        if isinstance(chosen, Task):
            return chosen
        if chosen is not None:
            for t in self.tasks:
                if t.id == chosen:
                    return t
            raise ValueError(f"no task with id {chosen!r}")
        return self.tasks[int(self.np_random.integers(len(self.tasks)))]

    # -- the same, as coroutines on the connection's loop ------------------------------------
    async def areset(self, task: Task) -> tuple[str, dict[str, Any]]:
        self._task, self._steps, self._broken = task, 0, None
        info: dict[str, Any] = {"task_id": task.id}
        try:
            sb = await self._pristine()
            self._session = await self._setup(sb, task)
        except Exception as e:
            why = infra_failure(e)
            if why is None:
                raise
            log.warning("reset of task %s failed: %s", task.id, e)
            await self.arelease()
            self._broken = why
            info.update(infra_error=why[0], retryable=why[1])
        return observation(task.prompt, self.max_obs_chars), info

    async def astep(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        task = self._task
        if task is None:
            raise RuntimeError("call reset() before step()")
        self._steps += 1
        info: dict[str, Any] = {"task_id": task.id}
        if self._broken is not None:
            info.update(infra_error=self._broken[0], retryable=self._broken[1])
            return "", 0.0, False, True, info
        try:
            text, exit_code, timed_out = await self._act(action)
            assert self.sandbox is not None
            ctx = StepContext(self.sandbox, task, self._steps, action, exit_code, text,
                              submitted=is_submit(action))  # fmt: skip
            reward = float(await self.reward_fn(ctx))
        except Exception as e:
            why = infra_failure(e)
            if why is None:
                raise
            log.warning("step %d of task %s failed: %s", self._steps, task.id, e)
            await self.arelease()
            self._broken = why
            info.update(infra_error=why[0], retryable=why[1])
            return "", 0.0, False, True, info
        terminated = is_submit(action)
        truncated = not terminated and self._steps >= task.max_steps
        if exit_code is not None:  # a command ran (no key for edits and submit: vector
            info.update(exit_code=exit_code, timed_out=timed_out)  # infos mask missing keys)
        return observation(text, self.max_obs_chars), reward, terminated, truncated, info

    # -- sandboxes ----------------------------------------------------------------------
    async def _pristine(self) -> Sandbox:
        """The current sandbox if /v1/reset verifies it clean and its container
        never restarted, else a new one."""
        if self.sandbox is not None:
            try:
                report = await self.sandbox.reset()
                # MUST come after the reset: a container restart during the
                # episode or the reset voids its clean verdict (client/reuse.py).
                why = await self.sandbox.reuse_refusal(report)
            except (SandmanError, ApiError, OSError) as e:
                why = f"reset failed: {e}"
            if why is None:
                self._session = None  # reset closed every session
                return self.sandbox
            log.info("sandbox %s not reusable (%s): replacing it", self.sandbox.name, why)
            await self.arelease()
        for attempt in range(self.max_attempts):
            try:
                self.sandbox = await self._acquire()
                return self.sandbox
            except Exception as e:
                why = infra_failure(e)
                if why is None or not why[1] or attempt + 1 == self.max_attempts:
                    raise
                log.warning("sandbox start failed (%s), retrying", e)
        raise AssertionError("unreachable")

    async def _acquire(self) -> Sandbox:
        client = self.connection.client
        if self.pool is not None:
            claimed = await _claim(client, self.namespace, self.pool, self._pod["ttl"])
            if claimed is not None:
                sb, ready = claimed
                if not ready:
                    try:
                        await sb.wait_ready(self.startup_timeout_s)
                    except BaseException:
                        await sb.release()
                        raise
                return sb
        return await Sandbox.create(
            client, self.image, namespace=self.namespace, timeout_s=self.startup_timeout_s,
            **self._pod,
        )  # fmt: skip

    async def _setup(self, sb: Sandbox, task: Task) -> Session:
        for path, content in task.files.items():
            await sb.write_file(path, content)
        for cmd in task.setup:
            r = await sb.exec(["/bin/sh", "-c", cmd], cwd=task.cwd, timeout_s=600)
            if r.exit_code != 0:
                raise ValueError(
                    f"task {task.id}: setup command {cmd!r} exited {r.exit_code}: "
                    f"{(r.stderr or r.stdout)[-500:]}"
                )
        return await sb.session(cwd=task.cwd)

    async def arelease(self) -> None:
        """Release the sandbox (the next reset gets a new one)."""
        sb, self.sandbox, self._session = self.sandbox, None, None
        if sb is None:
            return
        try:
            await sb.release()
        except (ApiError, OSError) as e:
            log.warning("release of %s failed (%s); its lease will end it", sb.name, e)

    # -- actions -----------------------------------------------------------------------------
    async def _act(self, action: Action) -> tuple[str, int | None, bool]:
        """(transcript, exit code or None, timed out) of one action."""
        assert self.sandbox is not None and self._task is not None
        if is_submit(action):
            return "", None, False
        if isinstance(action, FileEdit):
            await self.sandbox.write_file(action.path, action.content)
            return f"wrote {len(action.content)} characters to {action.path}\n", None, False
        if not isinstance(action, str):
            raise TypeError(f"an action is a str or a FileEdit, not {type(action).__name__}")
        restarted = ""
        if self._session is None:
            self._session = await self.sandbox.session(cwd=self._task.cwd)
        try:
            r = await self._session.run(merged(action), timeout_s=self.step_timeout_s)
        except DaemonError as e:
            if e.code != "session_ended":
                raise
            # The agent's `exit` ended its shell: a new one starts where the task does.
            self._session = await self.sandbox.session(cwd=self._task.cwd)
            restarted = "[the shell had exited; a new one was started]\n"
            r = await self._session.run(merged(action), timeout_s=self.step_timeout_s)
        text = restarted + step_text(r.stdout, r.exit_code, r.timed_out, self.step_timeout_s)
        return text, r.exit_code, r.timed_out


async def check_reward(ctx: StepContext) -> float:
    """The default reward: on submit, 1.0 if the task's check exits 0, else 0.0."""
    if not ctx.submitted or ctx.task.check is None:
        return 0.0
    r = await ctx.sandbox.exec(["/bin/sh", "-c", ctx.task.check], cwd=ctx.task.cwd, timeout_s=600)
    return 1.0 if r.exit_code == 0 and not r.timed_out else 0.0


async def _claim(client: Any, namespace: str, pool: str, ttl: str) -> tuple[Sandbox, bool] | None:
    """(a warm pod of ``pool``, whether it is Ready), or None if it has no idle pod now."""
    import getpass
    import socket

    from sandman.contract import parse_duration
    from sandman.pools import NoIdlePod
    from sandman.pools.claim import claim

    try:
        res = await claim(
            client.kube, namespace, pool,
            claimer=f"gym-{getpass.getuser()}@{socket.gethostname()}", ttl=parse_duration(ttl),
        )  # fmt: skip
    except NoIdlePod:
        return None
    return Sandbox(client, res.pod), res.ready
