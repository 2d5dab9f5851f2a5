"""The arm64 daemon serves, run under qemu-user on this (amd64) machine.

The arm64 runtime tree is built from Debian's arm64 packages (python3.11 and
its libraries, fetched and checked by harness/images/debs.py, cached) exactly
as the amd64 one is from the host's; Debian's qemu-user-static (one binary
out of its .deb, cached; nothing installed on the host) runs it. The daemon
then does what it does in a sandbox: /healthz, a token-checked /v1/exec, its
version, a clean stop on SIGTERM. The daemon image for arm64 records its
architecture and carries that tree. Cold, the downloads are ~15 MB of arm64
packages and the ~60 MB qemu .deb; warm, the test takes a few seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sandman.daemon import __version__ as DAEMON_VERSION
from sandman.harness.cluster.config import default_cache_dir
from sandman.harness.images import debs, platforms
from sandman.harness.images.build import ImageBuilder
from sandman.harness.images.daemon_binary import ensure_daemon_tree, host_argv
from sandman.harness.testing import free_port

ARM64 = platforms.ARM64
TOKEN = "arm64-test-token"
# The emulated interpreter starts in ~1.5 s idle (~0.1 s native); a loaded
# 2-core machine can take several times that.
STARTUP_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0
EM_AARCH64 = 183  # e_machine of an aarch64 ELF

pytestmark = pytest.mark.skipif(
    os.uname().machine != "x86_64", reason="emulates arm64 on an x86_64 host"
)


def _e_machine(path: Path) -> int:
    with open(path, "rb") as f:
        head = f.read(20)
    assert head[:4] == b"\x7fELF", path
    return int.from_bytes(head[18:20], "little")


@pytest.fixture(scope="module")
def tree() -> Path:
    return ensure_daemon_tree(default_cache_dir(), progress=print, arch=ARM64)


def _api(
    port: int, method: str, path: str, body: object = None, token: str | None = TOKEN
) -> tuple[int, object]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            payload = resp.read()
            if resp.headers.get("Content-Type", "").startswith("application/json"):
                return resp.status, json.loads(payload)
            return resp.status, payload
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _healthz(port: int) -> int | None:
    try:
        return _api(port, "GET", "/healthz", token=None)[0]
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def test_tree_is_arm64(tree: Path) -> None:
    rt = tree / "rt"
    assert _e_machine(rt / "bin" / "sandmand") == EM_AARCH64
    assert _e_machine(rt / "lib" / ARM64.loader) == EM_AARCH64
    dynload = sorted((rt / "lib" / "python3.11" / "lib-dynload").iterdir())
    assert dynload and all(p.name.endswith("-aarch64-linux-gnu.so") for p in dynload), dynload
    assert all(_e_machine(p) == EM_AARCH64 for p in dynload)
    # The same sandbox path as on amd64: the absolute ELF interpreter (PT_INTERP,
    # near the start of the file) is the tree's own loader.
    head = (rt / "bin" / "sandmand").read_bytes()[:4096]
    assert f"/.sandman/rt/lib/{ARM64.loader}\0".encode() in head


def test_arm64_daemon_serves_under_qemu(tree: Path, tmp_path: Path) -> None:
    argv = host_argv(tree, ARM64)
    qemu = debs.qemu_user(default_cache_dir(), ARM64, progress=print)
    assert argv[0] == str(qemu)

    version = subprocess.run(
        [*argv, "version"], capture_output=True, text=True, timeout=STARTUP_TIMEOUT_S
    )
    assert (version.returncode, version.stdout.strip()) == (0, DAEMON_VERSION), version.stderr

    port = free_port()
    (tmp_path / "d").mkdir()
    log = tmp_path / "sandmand.log"
    serve = [
        *argv,
        "serve",
        f"--listen=127.0.0.1:{port}",
        f"--token-sha256={hashlib.sha256(TOKEN.encode()).hexdigest()}",
        f"--daemon-dir={tmp_path / 'd'}",
        "--python-dirs=none",
        "--grace=2",
    ]
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            serve,
            cwd=tmp_path,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        while _healthz(port) != 200:
            if proc.poll() is not None:
                pytest.fail(f"sandmand exited {proc.returncode}:\n{log.read_text()}")
            if time.monotonic() - started > STARTUP_TIMEOUT_S:
                pytest.fail(f"no /healthz 200 in {STARTUP_TIMEOUT_S}s:\n{log.read_text()}")
            time.sleep(0.1)
        print(f"\narm64 sandmand under qemu: /healthz 200 after {time.monotonic() - started:.1f}s")
        # It is the emulator that runs: the process's executable is qemu's.
        assert Path(f"/proc/{proc.pid}/exe").resolve() == qemu.resolve()

        status, _ = _api(port, "POST", "/v1/exec", {"cmd": ["echo", "hi"]}, token="wrong")
        assert status == 401
        status, r = _api(port, "POST", "/v1/exec", {"cmd": ["echo", "hi from arm64"]})
        assert status == 200, r
        assert isinstance(r, dict)
        assert (r["exit_code"], r["stdout"]) == (0, "hi from arm64\n")
        status, r = _api(port, "POST", "/v1/exec", {"cmd": "echo $((6*7)) >&2; exit 3"})
        assert isinstance(r, dict) and (r["exit_code"], r["stderr"]) == (3, "42\n")

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STOP_TIMEOUT_S) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_arm64_daemon_image(tree: Path, tmp_path: Path) -> None:
    builder = ImageBuilder(default_cache_dir(), progress=print)
    image = builder.build("daemon", "0.0.0-arm64test", arch=ARM64)
    config = json.loads(builder.store.read(image.config.digest))
    assert (config["architecture"], config["os"], config["variant"]) == ("arm64", "linux", "v8")
    (layer,) = image.layers
    with tarfile.open(builder.store.path(layer.blob.digest), "r:gz") as tar:
        member = tar.extractfile(".sandman/rt/bin/sandmand")
        assert member is not None
        head = member.read(20)
    assert int.from_bytes(head[18:20], "little") == EM_AARCH64
    # The amd64 image of the same version is another manifest.
    assert builder.build("daemon", "0.0.0-arm64test").manifest.digest != image.manifest.digest
