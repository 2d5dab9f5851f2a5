"""SWE-ReX requests mapped onto daemon calls, and daemon results back onto SWE-ReX's
observations and exceptions (the parts SWE-agent reacts to)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest
from swerex.exceptions import CommandTimeoutError, NonZeroExitCodeError
from swerex.runtime.abstract import BashAction, Command

from sandman.adapters.shell import merged
from sandman.adapters.swerex import SandmanDeployment, SandmanDeploymentConfig
from sandman.adapters.swerex_runtime import (
    command_response,
    exec_argv,
    observation,
    syntax_error,
    tar_of,
)
from sandman.client import ExecResult


def result(code: int = 0, out: str = "", err: str = "", timed_out: bool = False) -> ExecResult:
    return ExecResult(code, out.encode(), err.encode(), timed_out, False, 1.0)


def bash(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)


def test_merged_keeps_state_order_and_exit_code_in_the_same_shell() -> None:
    # Run in one real bash, the way a session runs consecutive commands.
    first = merged("cd /tmp; echo out; echo err >&2; echo out2; export Z=5 # a comment")
    second = merged("echo $Z $(pwd); (exit 4)")
    p = bash(f"{first}\n{second}\necho code=$?")
    assert (p.stdout, p.stderr) == ("out\nerr\nout2\n5 /tmp\ncode=4\n", "")


def test_merged_leaves_heredocs_working() -> None:
    p = bash(merged("cat <<EOF\nhello\nEOF"))
    assert (p.stdout, p.returncode) == ("hello\n", 0)


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        (Command(command=["echo", "hi"]), ["echo", "hi"]),
        (Command(command="ls"), ["ls"]),  # subprocess: a string without shell is the program
        (Command(command="echo a; echo b", shell=True), "echo a; echo b"),
        (Command(command=["echo", "a b"], shell=True), "echo 'a b'"),
        (
            Command(command="echo o; echo e >&2", shell=True, merge_output_streams=True),
            "{ echo o; echo e >&2\n} 2>&1",
        ),
        (
            Command(command=["sh", "-c", "echo e >&2"], merge_output_streams=True),
            ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh", "sh", "-c", "echo e >&2"],
        ),
    ],
)
def test_exec_argv_follows_subprocess_rules(command: Command, argv: str | list[str]) -> None:
    assert exec_argv(command) == argv


def test_merged_argv_really_merges() -> None:
    argv = exec_argv(Command(command=["sh", "-c", "echo o; echo e >&2"], merge_output_streams=True))
    assert isinstance(argv, list)
    p = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert (p.stdout, p.stderr) == ("o\ne\n", "")


@pytest.mark.parametrize(
    ("check", "code", "want"),
    [("silent", 3, 3), ("ignore", 3, None), ("raise", 0, 0), ("silent", 0, 0)],
)
def test_observation_honours_check(check: str, code: int, want: int | None) -> None:
    obs = observation(BashAction(command="x", check=check), result(code, "out\n"))
    assert (obs.output, obs.exit_code) == ("out\n", want)


def test_observation_raises_on_non_zero_exit_with_check_raise() -> None:
    with pytest.raises(NonZeroExitCodeError, match=r"^boom: .*exit code 3"):
        observation(BashAction(command="(exit 3)", error_msg="boom"), result(3))


def test_a_timeout_raises_what_swe_agent_interrupts_on_whatever_the_check() -> None:
    for check in ("raise", "silent", "ignore"):
        with pytest.raises(CommandTimeoutError):
            observation(
                BashAction(command="sleep 9", timeout=1, check=check), result(-9, timed_out=True)
            )
    with pytest.raises(CommandTimeoutError):
        command_response(Command(command="sleep 9", timeout=1), result(-9, timed_out=True))


def test_command_response_keeps_streams_apart_and_checks_when_asked() -> None:
    r = command_response(Command(command="x"), result(2, "o\n", "e\n"))
    assert (r.stdout, r.stderr, r.exit_code) == ("o\n", "e\n", 2)
    with pytest.raises(NonZeroExitCodeError, match="clone failed"):
        command_response(Command(command="x", check=True, error_msg="clone failed"), result(2))


def test_syntax_error_carries_bash_output_like_swe_rex() -> None:
    p = bash("bash -n <<'EOF'\nif then\nEOF")
    err = syntax_error("if then", result(p.returncode, p.stdout, p.stderr))
    assert "syntax error" in err.extra_info["bash_stderr"]
    assert "if then" in str(err)


def test_tar_of_puts_the_directory_contents_at_the_target(tmp_path: Path) -> None:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "a.py").write_text("A")
    (tmp_path / "src" / "top.txt").write_text("T")
    with tarfile.open(fileobj=io.BytesIO(tar_of(tmp_path / "src"))) as tar:
        assert sorted(tar.getnames()) == ["pkg", "pkg/a.py", "top.txt"]


def test_config_round_trips_and_refuses_unknown_fields() -> None:
    cfg = SandmanDeploymentConfig(image="127.0.0.1:5000/sandman/swe:1", ttl="1h")
    again = SandmanDeploymentConfig.model_validate(cfg.model_dump())
    assert again == cfg and again.type == "sandman"
    assert isinstance(again.get_deployment(), SandmanDeployment)
    with pytest.raises(ValueError, match="imagee"):
        SandmanDeploymentConfig.model_validate({"imagee": "x"})


async def test_an_unstarted_deployment_says_so() -> None:
    from swerex.exceptions import DeploymentNotStartedError

    d = SandmanDeployment(image="127.0.0.1:5000/sandman/swe:1")
    with pytest.raises(DeploymentNotStartedError):
        await d.is_alive()
    with pytest.raises(DeploymentNotStartedError):
        _ = d.runtime
    await d.stop()  # stopping what never started is fine (SWE-ReX's __del__ does it)
