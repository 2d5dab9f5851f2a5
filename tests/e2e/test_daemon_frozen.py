"""The daemon's runtime tree runs as PID 1 in root filesystems without Python.

Builds the tree (cached; `make daemon` does the same) and runs it under
`unshare --pid --fork --mount-proc` + `chroot`, the way a container runtime
would, in (a) a rootfs holding nothing but busybox-static (no libc, no /tmp)
and (b) the Debian rootfs of the `swe` image. As in a sandbox, the tree sits at
/.sandman/rt (the init container's copy in the emptyDir) and nothing is
unpacked at start (see daemon/freeze/README.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandman.daemon import __version__ as DAEMON_VERSION
from sandman.harness.cluster.config import default_cache_dir
from sandman.harness.images.build import ImageBuilder
from sandman.harness.images.daemon_binary import ensure_daemon_tree, serve_argv
from sandman.harness.testing import free_port, wait_for

BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static: needs no shared libc
UNSHARE = shutil.which("unshare")
CHROOT = shutil.which("chroot")

# A start (the interpreter and the daemon's imports) takes ~0.1 s idle and
# ~1 s on a loaded 2-core machine; 30 s leaves room without hiding a hang.
STARTUP_TIMEOUT_S = 30.0
# The daemon gives its children 5 s of grace on SIGTERM (config.grace_s) but
# runs none here, so it should be gone at once (0.1 s here); 5 s is "a few".
STOP_TIMEOUT_S = 5.0
HEALTHZ_POLL_S = 0.01

TOKEN = "frozen-test-token"

# An image's own library and Python variables: they must not reach the daemon
# (DT_RPATH, -I: it would not start with this PYTHONHOME), and must reach its
# commands unchanged.
IMAGE_ENV = {
    "LD_LIBRARY_PATH": "/nonexistent/lib",
    "PYTHONPATH": "/nonexistent/py",
    "PYTHONHOME": "/nonexistent",
}
# What a container runtime gives PID 1: a PATH, the image's variables, and
# (from the webhook) the token's hash.
SANDBOX_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "SANDMAN_TOKEN_SHA256": hashlib.sha256(TOKEN.encode()).hexdigest(),
    **IMAGE_ENV,
}
DAEMON = serve_argv()


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (unshare --pid, mount proc, chroot)"
    if UNSHARE is None or CHROOT is None:
        return "unshare or chroot not on PATH (util-linux, coreutils)"
    if os.uname().machine != "x86_64":
        return "sandmand is built for x86_64 only"
    return None


UNAVAILABLE = _unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"frozen daemon: {UNAVAILABLE}")


@pytest.fixture(scope="module")
def sandmand() -> Path:
    return ensure_daemon_tree(default_cache_dir(), progress=print)


# -- root filesystems ----------------------------------------------------------
def _busybox_root(root: Path) -> None:
    (root / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], check=True, capture_output=True, text=True
    ).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
    (root / "proc").mkdir()  # mount point only: no /tmp, /etc, /lib or /dev


def _debian_root(root: Path) -> None:
    builder = ImageBuilder(default_cache_dir(), progress=print)
    image = builder.build("swe")
    root.mkdir(parents=True)
    # Our own layers, so trusting their links and modes is fine.
    extra = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
    for layer in image.layers:
        with tarfile.open(builder.store.path(layer.blob.digest), "r:gz") as tar:
            tar.extractall(root, numeric_owner=True, **extra)  # type: ignore[arg-type]
    (root / "proc").mkdir(exist_ok=True)


@pytest.fixture(scope="module", params=["busybox", "debian"])
def rootfs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    kind = request.param
    if kind == "busybox" and not BUSYBOX.exists():
        pytest.skip(f"{BUSYBOX} missing: apt-get install busybox-static")
    if kind == "debian" and (shutil.which("debootstrap") is None or shutil.which("git") is None):
        pytest.skip("the swe image needs debootstrap and git on PATH")
    root = tmp_path_factory.mktemp("rootfs") / kind
    (_busybox_root if kind == "busybox" else _debian_root)(root)
    yield root
    shutil.rmtree(root, ignore_errors=True)  # a Debian rootfs is a few hundred MB


@pytest.fixture
def daemon_dir(rootfs: Path, sandmand: Path) -> Path:
    """A fresh /.sandman holding only the tree, as the init container leaves it."""
    d = rootfs / ".sandman"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    shutil.copytree(sandmand / "rt", d / "rt", symlinks=True)
    return d


# -- helpers -------------------------------------------------------------------
def _in_new_pid_ns(root: Path, *argv: str) -> list[str]:
    # --mount-proc mounts a fresh /proc for the new namespace inside the rootfs
    # (staticx reads /proc/self/exe); chroot is exec'd, so the daemon is PID 1.
    assert UNSHARE is not None and CHROOT is not None
    return [UNSHARE, "--pid", "--fork", f"--mount-proc={root}/proc", CHROOT, str(root), *argv]


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _namespace_init(unshare_pid: int) -> int:
    """Host pid of the namespace's PID 1: the one child `unshare --fork` made."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        kids = _children(unshare_pid)
        if kids:
            return kids[0]
        time.sleep(HEALTHZ_POLL_S)
    raise AssertionError(f"unshare (pid {unshare_pid}) has no child")


def _healthz_status(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def _wait_healthy(proc: subprocess.Popen[bytes], port: int, log: Path, started: float) -> float:
    while time.monotonic() - started < STARTUP_TIMEOUT_S:
        if _healthz_status(port) == 200:
            return time.monotonic() - started
        if proc.poll() is not None:
            pytest.fail(f"sandmand exited {proc.returncode} before /healthz:\n{log.read_text()}")
        time.sleep(HEALTHZ_POLL_S)
    pytest.fail(f"no 200 from /healthz within {STARTUP_TIMEOUT_S}s:\n{log.read_text()}")


def _api(port: int, method: str, path: str, body: object = None, raw: bytes | None = None):  # type: ignore[no-untyped-def]
    data = json.dumps(body).encode() if body is not None else raw
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    try:
        resp = urllib.request.urlopen(req, timeout=30)
    except urllib.error.HTTPError as e:
        e.msg = f"{e.msg}: {e.read().decode(errors='replace')}"
        raise
    with resp:
        payload = resp.read()
        if resp.headers.get("Content-Type", "").startswith("application/json"):
            return json.loads(payload)
        return payload


def _exercise_api(port: int) -> None:
    """Exec, environment hygiene, files and reaping through the frozen daemon."""
    r = _api(port, "POST", "/v1/exec", {"cmd": ["echo", "hi"]})
    assert (r["exit_code"], r["stdout"]) == (0, "hi\n")
    r = _api(port, "POST", "/v1/exec", {"cmd": "echo $((6*7)) >&2; exit 3"})
    assert (r["exit_code"], r["stderr"]) == (3, "42\n")
    env = _api(port, "POST", "/v1/exec", {"cmd": ["env"]})["stdout"].splitlines()
    assert not [v for v in env if v.startswith("SANDMAN_TOKEN")], env
    for k, v in IMAGE_ENV.items():
        assert f"{k}={v}" in env, (k, env)
    _api(port, "PUT", "/v1/files?path=/work/note.txt&mkdirs=1", raw=b"frozen files")
    assert _api(port, "GET", "/v1/files?path=/work/note.txt") == b"frozen files"
    assert _api(port, "POST", "/v1/exec", {"cmd": ["cat", "/work/note.txt"]})["stdout"] == (
        "frozen files"
    )
    # The daemon's own files are off limits, the executable included.
    try:
        _api(port, "GET", "/v1/files?path=/.sandman/rt/bin/sandmand")
        raise AssertionError("the daemon's executable was readable")
    except urllib.error.HTTPError as e:
        assert e.code == 403
    # Orphans (children of exited commands) are reaped: no zombies in the sandbox.
    for _ in range(5):
        _api(port, "POST", "/v1/exec", {"cmd": "sleep 0.1 & exit 0"})
    status = wait_for(
        lambda: (s := _api(port, "GET", "/v1/status"))["orphans_reaped"] >= 5 and s,
        timeout=STARTUP_TIMEOUT_S,
        what="5 orphans reaped",
    )
    assert not [p for p in status["processes"] if p["state"] == "Z"], status["processes"]
    # A timeout kills the whole tree, exit code exact.
    r = _api(port, "POST", "/v1/exec", {"cmd": "sleep 30 & sleep 31", "timeout_s": 0.3})
    assert (r["timed_out"], r["exit_code"]) == (True, -9)
    # Lazily imported modules are in the tree: tar both ways, a streamed exec,
    # status (processes), metrics, a reset.
    tar = _api(port, "GET", "/v1/files/tar?path=/work&gzip=1")
    assert tar[:2] == b"\x1f\x8b"
    _api(port, "PUT", "/v1/files/tar?path=/work/copy&mkdirs=1", raw=tar)
    assert _api(port, "GET", "/v1/files?path=/work/copy/work/note.txt") == b"frozen files"
    assert b'"type": "result"' in _api(port, "POST", "/v1/exec?stream=1", {"cmd": ["true"]})
    assert b"sandman_daemon_requests_total" in _api(port, "GET", "/metrics")
    assert _api(port, "POST", "/v1/reset")["actions"]
    assert _api(port, "GET", "/v1/idle") == {"idle_s": 0}


# -- the test ------------------------------------------------------------------
def test_frozen_daemon_serves_as_pid1(
    rootfs: Path, daemon_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    log = tmp_path / "sandmand.log"
    argv = _in_new_pid_ns(rootfs, *DAEMON, "serve", "--listen", f"127.0.0.1:{port}")
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=SANDBOX_ENV, stdout=out, stderr=subprocess.STDOUT)
    pid1: int | None = None
    try:
        elapsed = _wait_healthy(proc, port, log, started)
        with capsys.disabled():
            print(f"\n[{rootfs.name}] first /healthz 200 after {elapsed * 1000:.0f} ms")

        _exercise_api(port)

        # Nothing was unpacked: the daemon's dir holds the tree and its state
        # (scratch dir, the pristine record where there is something to record).
        names = {p.name for p in daemon_dir.iterdir()}
        assert {"rt", "run"} <= names <= {"rt", "run", "pristine.json", "pristine.rec"}, names
        # One process: the daemon is the namespace's PID 1, with no bootloader.
        status = _api(port, "GET", "/v1/status")
        ours = [p for p in status["processes"] if p["pid"] == 1]
        assert ours and ours[0]["cmd"][0] == DAEMON[0], status["processes"]
        with capsys.disabled():
            print(f"[{rootfs.name}] PID 1 RSS {ours[0]['rss_bytes'] / 2**20:.1f} MiB")

        version = subprocess.run(
            _in_new_pid_ns(rootfs, *DAEMON, "version"),
            env=SANDBOX_ENV,
            capture_output=True,
            text=True,
            timeout=STARTUP_TIMEOUT_S,
        )
        assert version.returncode == 0, version.stderr
        assert version.stdout.strip() == DAEMON_VERSION

        pid1 = _namespace_init(proc.pid)
        os.kill(pid1, signal.SIGTERM)
        stop = time.monotonic()
        try:
            rc = proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"PID 1 still running {STOP_TIMEOUT_S}s after SIGTERM:\n{log.read_text()}")
        with capsys.disabled():
            print(f"[{rootfs.name}] exited {rc} {time.monotonic() - stop:.2f}s after SIGTERM")
        # 0 for a clean shutdown; unshare re-raises a fatal signal as itself.
        assert rc in (0, -signal.SIGTERM, 128 + signal.SIGTERM), log.read_text()
    finally:
        if proc.poll() is None:
            # SIGKILL to a namespace's PID 1 kills everything in it.
            for pid in [pid1] if pid1 else _children(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()
