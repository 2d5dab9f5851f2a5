"""The SDK and the CLI end to end on the real node."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandman.client import Sandbox, SandboxStartError, SandmanClient
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.images.recipes import SWE_BUGGY_LINE, SWE_FIXED_LINE
from sandman.kube_async import PODS, ApiError
from tests.e2e.runtimes import RUNTIME_PROBE, assert_runs_under

REAL = {"sandman.dev/node-kind": "real"}


@pytest.fixture(params=["direct", "proxy"])
async def sdk(
    request: pytest.FixtureRequest, cluster: LocalCluster, namespace: str, real_node: RealNode
) -> AsyncIterator[SandmanClient]:
    async with SandmanClient(
        kubeconfig=cluster.kubeconfig, namespace=namespace, transport=request.param
    ) as client:
        yield client


# Every image with both transports under runc; gVisor (RuntimeClass gvisor,
# required by a policy rule: tests/e2e/runtimes.py) with the Debian image.
@pytest.mark.parametrize(
    ("image_name", "runtime", "sdk"),
    [
        ("tiny", "runc", "direct"),
        ("tiny", "runc", "proxy"),
        ("swe", "runc", "direct"),
        ("swe", "runc", "proxy"),
        ("swe", "gvisor", "direct"),
    ],
    indirect=["runtime", "sdk"],
)
async def test_create_exec_files_reset_release(
    sdk: SandmanClient, images: dict[str, str], image_name: str, runtime: str
) -> None:
    async with await Sandbox.create(
        sdk, images[image_name], node_selector=REAL, command=["sleep", "3600"], ttl="30m"
    ) as sb:
        assert_runs_under(runtime, (await sb.exec(RUNTIME_PROBE)).stdout)
        r = await sb.exec("echo $((2+3)) $(hostname)")
        assert (r.exit_code, r.stdout) == (0, f"5 {sb.name}\n")
        assert sb.timings.phases()["ttfc_s"] is not None
        await sb.write_file("/tmp/x/hello.txt", b"hi\x00there")
        assert await sb.read_file("/tmp/x/hello.txt") == b"hi\x00there"
        assert [e["name"] for e in await sb.list_dir("/tmp/x")] == ["hello.txt"]
        session = await sb.session()
        await session.run("cd /tmp/x && export Y=7")
        assert (await session.run("echo $Y $(pwd)")).stdout == "7 /tmp/x\n"
        proc = await sb.start(["sh", "-c", "echo started; sleep 300"])
        data, _ = await proc.output(wait_s=5)
        assert data == b"started\n"
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("pkg/a.txt")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"a"))
        await sb.upload_tar("/srv", buf.getvalue())
        assert await sb.read_file("/srv/pkg/a.txt") == b"a"
        with tarfile.open(fileobj=io.BytesIO(await sb.download_tar("/srv/pkg"))) as back:
            assert sorted(back.getnames()) == ["pkg", "pkg/a.txt"]
        report = await sb.reset()
        assert report["clean"] is True, report
        assert (await sb.exec("ls /tmp")).stdout == ""  # temp cleared, processes gone
        name = sb.name
    # Released: deleted (terminating for its grace period, or already gone).
    try:
        pod = await sdk.kube.get(PODS, name, sdk.namespace)
        assert pod["metadata"].get("deletionTimestamp")
    except ApiError as e:
        assert e.not_found


async def test_swe_style_flow(sdk: SandmanClient, images: dict[str, str]) -> None:
    async with await Sandbox.create(
        sdk, images["swe"], node_selector=REAL, command=["sleep", "3600"]
    ) as sb:
        status = await sb.exec("git status --porcelain && git log --oneline | wc -l")
        assert status.stdout.strip() == "1"  # a clean checkout at one commit
        failing = await sb.exec(["python3", "-m", "unittest"], cwd="/work/repo")
        assert failing.exit_code == 1 and "FAILED (failures=1)" in failing.stderr
        # The agent's patch, applied as a file write.
        source = (await sb.read_file("/work/repo/calc/ops.py")).decode()
        assert SWE_BUGGY_LINE in source
        await sb.write_file(
            "/work/repo/calc/ops.py", source.replace(SWE_BUGGY_LINE, SWE_FIXED_LINE)
        )
        passing = await sb.exec(["python3", "-m", "unittest"], cwd="/work/repo")
        assert passing.exit_code == 0 and "OK" in passing.stderr
        diff = await sb.exec(["git", "diff", "--stat"], cwd="/work/repo")
        assert "calc/ops.py | 2 +-" in diff.stdout
        # And back to the task's start for the next rollout.
        assert (await sb.reset())["clean"] is True
        again = await sb.exec(["python3", "-m", "unittest"], cwd="/work/repo")
        assert again.exit_code == 1


async def test_missing_image_fails_fast_and_not_retryable(sdk: SandmanClient) -> None:
    t0 = time.monotonic()
    with pytest.raises(SandboxStartError) as e:
        # With a command: nothing to look up at admission, so the pod is
        # created and the kubelet's pull is what fails (without one, the
        # webhook's ENTRYPOINT lookup denies it: tests/unit/webhook/test_imageconfig.py).
        missing = "127.0.0.1:5000/sandman/no-such-image:1"
        await Sandbox.create(sdk, missing, command=["sleep", "1"], node_selector=REAL)
    elapsed = time.monotonic() - t0
    assert e.value.reason == SandboxStartError.IMAGE_NOT_FOUND and e.value.retryable is False
    assert elapsed < 60, elapsed  # seconds, not the 300 s start timeout
    print(f"missing image reported after {elapsed:.1f}s")


async def test_policy_denial_surfaces_the_webhook_message(sdk: SandmanClient) -> None:
    with pytest.raises(SandboxStartError) as e:
        await Sandbox.create(sdk, "docker.io/library/python:3.11", node_selector=REAL)
    assert e.value.reason == SandboxStartError.POLICY_DENIED and not e.value.retryable
    assert "[registry]" in e.value.message and "fix:" in e.value.message


def test_cli_round_trip_with_only_a_kubeconfig(
    cluster: LocalCluster, namespace: str, images: dict[str, str], tmp_path: Path
) -> None:
    bindir = Path(sys.executable).parent
    kubectl_dir = tmp_path / "bin"
    kubectl_dir.mkdir()
    (kubectl_dir / "kubectl").symlink_to(cluster.binaries.kubectl)
    env = {
        "PATH": f"{kubectl_dir}:{bindir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "KUBECONFIG": str(cluster.kubeconfig),
    }

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), env=env, capture_output=True, text=True, timeout=180, check=check
        )

    name = run(
        "sandman", "run", images["tiny"], "-n", namespace, "--ttl", "20m", "--", "sleep", "3600"
    ).stdout.strip()
    # The kubectl plugin: kubectl finds kubectl-sandman on PATH.
    out = run(
        "kubectl",
        "sandman",
        "exec",
        name,
        "-n",
        namespace,
        "--",
        "sh",
        "-c",
        "echo via-plugin; echo oops >&2; exit 42",
        check=False,
    )
    assert (out.returncode, out.stdout, out.stderr) == (42, "via-plugin\n", "oops\n")
    ls = run("kubectl", "sandman", "ls", "-n", namespace, "-o", "json").stdout
    assert name in ls
    run("kubectl", "sandman", "release", name, "-n", namespace)
    assert os.environ.get("SANDMAN_TOKEN") is None  # nothing but the kubeconfig was used
