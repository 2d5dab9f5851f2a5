"""E2B's published Python SDK (e2b 2.63.0, unmodified) pointed at `sandman e2b-gateway`
by environment variables alone, driving a sandbox on the real node."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import AuthenticationException, CommandExitException, Sandbox, TimeoutException
from e2b.exceptions import FileNotFoundException, SandboxException
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.contract import ANN_EXPIRES_AT, parse_time
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.testing import free_port

KEY = "e2e-gateway-key"


@pytest.fixture
def gateway(
    cluster: LocalCluster,
    namespace: str,
    real_node: RealNode,
    images: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Iterator[str]:
    port = free_port()
    log = (tmp_path / "gateway.log").open("w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "sandman"), "e2b-gateway",
         "--listen", f"127.0.0.1:{port}", "--kubeconfig", str(cluster.kubeconfig),
         "-n", namespace, "--template", f"base={images['swe']}",
         "--node-selector", "sandman.dev/node-kind=real"],
        env={**os.environ, "SANDMAN_E2B_API_KEY": KEY},
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the gateway did not listen"
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}"
        for name, value in (("E2B_API_URL", url), ("E2B_SANDBOX_URL", url), ("E2B_API_KEY", KEY)):
            monkeypatch.setenv(name, value)
        yield url
    finally:
        proc.terminate()  # graceful: in-flight requests are answered first
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        finally:
            log.close()


def test_e2b_sdk_lifecycle_commands_and_files(
    gateway: str, core: CoreV1Api, namespace: str
) -> None:
    # A cold pull of the task image can outlast the SDK's 60 s default request timeout.
    sb = Sandbox.create(
        timeout=300, metadata={"run": "e2e"}, envs={"FROM_CREATE": "yes"}, request_timeout=300
    )
    name = sb.sandbox_id
    try:
        # -- commands: foreground, streaming callbacks, exit codes, env, cwd
        r = sb.commands.run("echo hello; echo oops >&2; echo $FROM_CREATE; pwd")
        assert (r.stdout, r.stderr, r.exit_code) == ("hello\nyes\n/root\n", "oops\n", 0)
        out: list[str] = []
        err: list[str] = []
        r = sb.commands.run(
            "for i in 1 2 3; do echo line$i; sleep 0.2; done; echo e >&2",
            on_stdout=out.append, on_stderr=err.append,
        )  # fmt: skip
        assert "".join(out) == "line1\nline2\nline3\n" and "".join(err) == "e\n"
        with pytest.raises(CommandExitException) as failed:
            sb.commands.run("echo failing >&2; exit 3")
        assert (failed.value.exit_code, failed.value.stderr) == (3, "failing\n")
        assert sb.commands.run("echo $A $(pwd)", envs={"A": "a"}, cwd="/tmp").stdout == "a /tmp\n"

        # -- background commands: list, stdin, kill, timeout (= lifetime, as in envd)
        bg = sb.commands.run("sleep 0.5; echo bg-done", background=True)
        assert bg.pid in [p.pid for p in sb.commands.list()]
        assert bg.wait().stdout == "bg-done\n"
        reader = sb.commands.run("read x; echo got:$x", background=True, stdin=True)
        sb.commands.send_stdin(reader.pid, "hi\n")
        assert reader.wait().stdout == "got:hi\n"
        sleeper = sb.commands.run("sleep 300", background=True)
        assert sb.commands.kill(sleeper.pid) is True
        with pytest.raises(CommandExitException) as killed:
            sleeper.wait()
        assert (killed.value.exit_code, killed.value.error) == (-1, "signal: killed")
        assert sb.commands.kill(sleeper.pid) is False  # gone
        with pytest.raises(TimeoutException):
            sb.commands.run("sleep 30", timeout=1)
        deadline = time.monotonic() + 30
        while sb.commands.list():  # killed by the gateway at its timeout, not left running
            assert time.monotonic() < deadline, sb.commands.list()
            time.sleep(0.2)

        # -- files
        assert sb.files.make_dir("/work/e2b") is True
        assert sb.files.make_dir("/work/e2b") is False
        info = sb.files.write("/work/e2b/a.txt", "content-1\n")
        assert (info.name, info.path) == ("a.txt", "/work/e2b/a.txt")
        assert sb.files.read("/work/e2b/a.txt") == "content-1\n"
        sb.files.write("/work/e2b/bin", b"\x00\xff")
        assert sb.files.read("/work/e2b/bin", format="bytes") == bytearray(b"\x00\xff")
        assert sb.files.exists("/work/e2b/a.txt") and not sb.files.exists("/work/e2b/nope")
        assert sb.files.rename("/work/e2b/a.txt", "/work/e2b/b.txt").path == "/work/e2b/b.txt"
        listed = {(e.name, e.type.value, e.size) for e in sb.files.list("/work/e2b")}
        assert listed == {("b.txt", "file", 10), ("bin", "file", 2)}
        with pytest.raises(FileNotFoundException):
            sb.files.read("/work/e2b/missing")
        sb.files.remove("/work/e2b")
        assert not sb.files.exists("/work/e2b")

        # -- lifecycle: set_timeout moves the lease, info, connect, list
        before = time.time()
        sb.set_timeout(1200)
        pod = core.read_namespaced_pod(name, namespace)
        expires = parse_time(pod.metadata.annotations[ANN_EXPIRES_AT]).timestamp()
        assert before + 1100 < expires < time.time() + 1300
        assert sb.get_info().metadata == {"run": "e2e"} and sb.is_running()
        assert Sandbox.connect(name).commands.run("echo again").stdout == "again\n"
        assert name in [s.sandbox_id for s in Sandbox.list().next_items()]
    finally:
        assert sb.kill() is True
    assert Sandbox.kill(name) is False  # already released
    try:
        assert core.read_namespaced_pod(name, namespace).metadata.deletion_timestamp
    except ApiException as e:
        assert e.status == 404


def test_e2b_sdk_errors(gateway: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SandboxException, match="unknown template"):
        Sandbox.create("no-such-template")
    monkeypatch.setenv("E2B_API_KEY", "wrong")
    with pytest.raises(AuthenticationException):
        Sandbox.create()
