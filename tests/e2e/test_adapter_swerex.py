"""SWE-ReX's own usage examples (docs/usage.md, tests/test_execution.py of swe-rex
1.4.0), run unchanged against a SandmanDeployment on the real node."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    DeploymentNotStartedError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (
    BashAction,
    BashInterruptAction,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)

from sandman.adapters.swerex import SandmanDeploymentConfig
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode

REAL = {"sandman.dev/node-kind": "real"}


@pytest.fixture
def config(
    cluster: LocalCluster, namespace: str, real_node: RealNode, images: dict[str, str]
) -> SandmanDeploymentConfig:
    return SandmanDeploymentConfig(
        image=images["swe"],
        namespace=namespace,
        kubeconfig=str(cluster.kubeconfig),
        command=["sleep", "infinity"],
        node_selector=REAL,
        ttl="15m",
    )


def test_swe_rex_usage_examples_through_fresh_event_loops(
    config: SandmanDeploymentConfig, tmp_path: Path
) -> None:
    # SWE-agent calls every method through its own asyncio.run, so each call
    # below runs on a new event loop, as there.
    deployment = config.get_deployment()
    with pytest.raises(DeploymentNotStartedError):
        asyncio.run(deployment.is_alive())
    asyncio.run(deployment.start())
    try:
        rt = deployment.runtime
        assert asyncio.run(deployment.is_alive())

        # docs/usage.md: one-off commands, then a session whose state persists.
        r = asyncio.run(rt.execute(Command(command=["echo", "Hello, world!"])))
        assert (r.stdout, r.stderr, r.exit_code) == ("Hello, world!\n", "", 0)
        asyncio.run(rt.create_session(CreateBashSessionRequest()))
        asyncio.run(rt.run_in_session(BashAction(command="export MYVAR='test'")))
        obs = asyncio.run(rt.run_in_session(BashAction(command="echo $MYVAR")))
        assert (obs.output.strip(), obs.exit_code) == ("test", 0)

        # tests/test_execution.py: a file round trip, a missing file, a shell command.
        path = "/tmp/swerex/test.txt"
        asyncio.run(rt.write_file(WriteFileRequest(path=path, content="test")))
        assert asyncio.run(rt.read_file(ReadFileRequest(path=path))).content == "test"
        with pytest.raises(FileNotFoundError):
            asyncio.run(rt.read_file(ReadFileRequest(path="/tmp/non_existent.txt")))
        cmd = Command(command="echo 'hello world'", shell=True)
        assert asyncio.run(rt.execute(cmd)).stdout == "hello world\n"

        # What SWE-agent reacts to: syntax errors (nothing runs), timeouts, interrupts.
        with pytest.raises(BashIncorrectSyntaxError):
            asyncio.run(rt.run_in_session(BashAction(command="if then; touch /tmp/ran")))
        assert asyncio.run(rt.execute(Command(command=["test", "-e", "/tmp/ran"]))).exit_code == 1
        with pytest.raises(CommandTimeoutError):
            asyncio.run(rt.run_in_session(BashAction(command="sleep 30", timeout=1)))
        asyncio.run(rt.run_in_session(BashInterruptAction()))
        obs = asyncio.run(rt.run_in_session(BashAction(command="echo out; echo err >&2")))
        assert obs.output == "out\nerr\n"  # stderr merged in order, as with a pty
        silent = BashAction(command="(exit 3)", check="silent")
        assert asyncio.run(rt.run_in_session(silent)).exit_code == 3

        # Sessions by name.
        with pytest.raises(SessionExistsError):
            asyncio.run(rt.create_session(CreateBashSessionRequest()))
        asyncio.run(rt.close_session(CloseBashSessionRequest()))
        with pytest.raises(SessionDoesNotExistError):
            asyncio.run(rt.run_in_session(BashAction(command="true")))

        # upload: a directory's contents land at the target, like SWE-ReX's unzip.
        (tmp_path / "repo" / "pkg").mkdir(parents=True)
        (tmp_path / "repo" / "pkg" / "mod.py").write_text("X = 1\n")
        (tmp_path / "repo" / "run.sh").write_text("echo ran\n")
        (tmp_path / "repo" / "run.sh").chmod(0o755)
        upload = UploadRequest(source_path=str(tmp_path / "repo"), target_path="/work/up")
        asyncio.run(rt.upload(upload))
        listed = asyncio.run(
            rt.execute(Command(command="cat /work/up/pkg/mod.py && /work/up/run.sh", shell=True))
        )
        assert (listed.stdout, listed.exit_code) == ("X = 1\nran\n", 0)
        sandbox = deployment.sandbox
    finally:
        asyncio.run(deployment.stop())
    asyncio.run(deployment.stop())  # idempotent
    assert sandbox.released
