"""Many SandmanEnvs stepped together on one event loop (a Gymnasium VectorEnv).

Gymnasium's ``AsyncVectorEnv`` would run one process per environment, each
with its own client and connection pool, for work that is only waiting on
the network. Here every sub-environment's ``areset``/``astep`` runs
concurrently on the one ``LoopClient`` they share: a batch step costs the
slowest environment's step, not their sum.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from sandman.adapters.gym import SandmanEnv
from sandman.adapters.gymtask import Action, Task
from sandman.adapters.loop import LoopClient


class SandmanVectorEnv(VectorEnv):  # type: ignore[type-arg]
    """``num_envs`` SandmanEnvs on one loop; autoreset ``NEXT_STEP`` (the default).

    Observations and actions are tuples of strings (``batch_space`` of a
    Text space is a Tuple). An environment whose episode ended is reset by
    the next ``step`` call, whose action for it is ignored. Safe to use from
    one thread at a time; ``close`` releases every sandbox.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(
        self,
        image: str,
        tasks: Task | Sequence[Task],
        num_envs: int,
        *,
        namespace: str = "default",
        kubeconfig: str | None = None,
        connection: LoopClient | None = None,
        **env_kwargs: Any,
    ) -> None:
        if num_envs < 1:
            raise ValueError("num_envs must be >= 1")
        self._owns_connection = connection is None
        self.connection = connection or LoopClient(kubeconfig=kubeconfig, namespace=namespace)
        self.envs = [
            SandmanEnv(image, tasks, namespace=namespace, connection=self.connection, **env_kwargs)
            for _ in range(num_envs)
        ]
        self.num_envs = num_envs
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._autoreset = np.zeros(num_envs, dtype=np.bool_)

    def _gather(self, coros: list[Any]) -> list[Any]:
        async def all_of() -> list[Any]:
            return list(await asyncio.gather(*coros))

        return self.connection.run(all_of())

    def reset(
        self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        tasks = []
        for env, s in zip(self.envs, seeds, strict=True):
            super(SandmanEnv, env).reset(seed=s)  # seeds the env's own RNG (gym.Env.reset)
            tasks.append(env.pick_task(options))
        results = self._gather([env.areset(t) for env, t in zip(self.envs, tasks, strict=True)])
        self._autoreset[:] = False
        infos: dict[str, Any] = {}
        for i, (_, info) in enumerate(results):
            infos = self._add_info(infos, info, i)
        return tuple(obs for obs, _ in results), infos

    def step(
        self, actions: Sequence[Action]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        async def one(i: int, env: SandmanEnv, action: Action) -> tuple[Any, ...]:
            if self._autoreset[i]:
                obs, info = await env.areset(env.pick_task(None))
                return obs, 0.0, False, False, info
            return await env.astep(action)

        results = self._gather(
            [one(i, e, a) for i, (e, a) in enumerate(zip(self.envs, actions, strict=True))]
        )
        rewards = np.array([r[1] for r in results], dtype=np.float64)
        terminated = np.array([r[2] for r in results], dtype=np.bool_)
        truncated = np.array([r[3] for r in results], dtype=np.bool_)
        infos: dict[str, Any] = {}
        for i, r in enumerate(results):
            infos = self._add_info(infos, r[4], i)
        self._autoreset = terminated | truncated
        return tuple(r[0] for r in results), rewards, terminated, truncated, infos

    def close_extras(self, **kwargs: Any) -> None:
        try:
            self._gather([env.arelease() for env in self.envs])
        finally:
            if self._owns_connection:
                self.connection.close()
