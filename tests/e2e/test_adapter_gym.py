"""Gymnasium episodes on real sandboxes: check_env, a solved SWE-style task, a vector
batch, and an infrastructure failure that must surface in info, never as a reward."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gymnasium.utils.env_checker import check_env
from kubernetes.client import CoreV1Api

from sandman.adapters.gym import SandmanEnv
from sandman.adapters.gym_vector import SandmanVectorEnv
from sandman.adapters.gymtask import FileEdit, Task
from sandman.adapters.loop import LoopClient
from sandman.client import Sandbox, SandmanError
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.images.recipes import SWE_BUGGY_LINE, SWE_FIXED_LINE
from sandman.harness.testing import wait_for

REAL = {"sandman.dev/node-kind": "real"}
FIX = Task(
    "calc-mean",
    "The tests in /work/repo fail. Fix the bug, then submit.",
    check="python3 -m unittest",
    cwd="/work/repo",
    max_steps=6,
)


@pytest.fixture
def connection(cluster: LocalCluster, namespace: str, real_node: RealNode) -> Iterator[LoopClient]:
    with LoopClient(kubeconfig=cluster.kubeconfig, namespace=namespace) as conn:
        yield conn


def unreachable(connection: LoopClient, sb: Sandbox) -> bool:
    try:
        connection.run(sb.status())
    except SandmanError:
        return True
    return False


def env_of(conn: LoopClient, images: dict[str, str], namespace: str, **kw: object) -> SandmanEnv:
    return SandmanEnv(images["swe"], FIX, namespace=namespace, connection=conn,
                      command=["sleep", "infinity"], node_selector=REAL, ttl="15m",
                      step_timeout_s=30, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_check_env_and_a_solved_episode(
    connection: LoopClient, images: dict[str, str], namespace: str
) -> None:
    env = env_of(connection, images, namespace)
    try:
        # Gymnasium's own checker: seeded resets and steps must replay exactly
        # (observations, rewards and info), on the same sandbox reset to pristine.
        check_env(env, skip_render_check=True)

        obs, info = env.reset(seed=1)
        assert obs == FIX.prompt and info == {"task_id": "calc-mean"}
        first = env.sandbox
        obs, reward, terminated, truncated, info = env.step("python3 -m unittest 2>&1 | tail -1")
        assert obs == "FAILED (failures=1)\n" and (reward, terminated, truncated) == (
            0.0,
            False,
            False,
        )
        assert info == {"task_id": "calc-mean", "exit_code": 0, "timed_out": False}
        source = env.step("cat calc/ops.py")[0]
        assert SWE_BUGGY_LINE in source
        edit = FileEdit("/work/repo/calc/ops.py", source.replace(SWE_BUGGY_LINE, SWE_FIXED_LINE))
        assert env.step(edit)[0].startswith("wrote ")
        obs, reward, terminated, truncated, _ = env.step("submit")
        assert (reward, terminated, truncated) == (1.0, True, False)

        # The next episode reuses the sandbox, verified pristine: the fix is gone.
        env.reset(seed=2)
        assert env.sandbox is first
        assert env.step("submit")[1] == 0.0
        # Truncation at max_steps; a timed-out command is an observation, not an error.
        env.reset()
        obs, _, _, _, info = env.step("sleep 60")
        assert "timed out after 30s" in obs and info["timed_out"] is True
        for _ in range(FIX.max_steps - 2):
            assert env.step("true")[3] is False
        assert env.step("true")[3] is True
    finally:
        env.close()


def test_an_infrastructure_failure_is_info_not_a_reward(
    connection: LoopClient, images: dict[str, str], namespace: str, core: CoreV1Api
) -> None:
    env = env_of(connection, images, namespace)
    try:
        env.reset(seed=0)
        lost = env.sandbox
        assert lost is not None
        core.delete_namespaced_pod(lost.name, namespace, grace_period_seconds=0)
        # The pod object goes first; its daemon answers until the kubelet kills it.
        wait_for(lambda: unreachable(connection, lost), timeout=120, what="the daemon gone")
        obs, reward, terminated, truncated, info = env.step("echo hi")
        assert (obs, reward, terminated, truncated) == ("", 0.0, False, True)
        assert info["retryable"] is True and info["infra_error"] in (
            "Unreachable", "SandboxGone", "Daemon502", "Daemon503")  # fmt: skip
        obs, info = env.reset(seed=0)  # a new sandbox, and the episode goes on
        assert "infra_error" not in info and env.sandbox is not lost
        assert env.step("echo hi")[0] == "hi\n"
    finally:
        env.close()


def test_vector_env_steps_a_batch_on_one_loop(
    connection: LoopClient, images: dict[str, str], namespace: str
) -> None:
    venv = SandmanVectorEnv(
        images["swe"], FIX, 3, namespace=namespace, connection=connection,
        command=["sleep", "infinity"], node_selector=REAL, ttl="15m",
    )  # fmt: skip
    try:
        obs, infos = venv.reset(seed=0)
        assert obs == (FIX.prompt,) * 3 and list(infos["task_id"]) == ["calc-mean"] * 3
        obs, rewards, terminated, truncated, infos = venv.step(("echo $((1+1))", "submit", "pwd"))
        assert obs == ("2\n", "", "/work/repo\n")
        assert list(rewards) == [0.0, 0.0, 0.0] and list(terminated) == [False, True, False]
        # NEXT_STEP autoreset: the finished env is reset by this step, its action ignored.
        obs, rewards, terminated, truncated, infos = venv.step(("true", "ignored", "true"))
        assert obs[1] == FIX.prompt and not terminated.any() and not truncated.any()
        assert len({e.sandbox.name for e in venv.envs if e.sandbox}) == 3
    finally:
        venv.close()
