"""Host-level setup and teardown for the real node (needs root).

Everything here is undone by the matching teardown: the pod bridge, the
cgroup root, mounts under the state dir and leftover containerd shims. All of
it is scoped to names and paths this cluster owns, so teardown never touches
another runtime's containers.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Requirement:
    what: str  # a command on PATH or an absolute file path
    package: str


# What the real node and our image recipes need, and the Debian package of each.
REQUIREMENTS = (
    Requirement("containerd", "containerd"),
    Requirement("runc", "runc"),
    Requirement("/usr/lib/cni/bridge", "containernetworking-plugins"),
    Requirement("docker-registry", "docker-registry"),
    Requirement("/bin/busybox", "busybox-static"),
    Requirement("debootstrap", "debootstrap"),
    Requirement("gcc", "gcc"),
    Requirement("ip", "iproute2"),
)


class HostSetupError(RuntimeError):
    pass


def real_node_unsupported_reason() -> str | None:
    """Why this machine cannot run the real node, or None."""
    if os.geteuid() != 0:
        return "needs root (kubelet, containerd, network and cgroup setup)"
    if not Path("/sys/fs/cgroup").is_dir():
        return "no cgroup filesystem at /sys/fs/cgroup"
    missing = missing_packages()
    if missing and shutil.which("apt-get") is None:
        return f"missing {', '.join(missing)} and no apt-get to install them"
    return None


def missing_packages() -> list[str]:
    out = []
    for req in REQUIREMENTS:
        found = Path(req.what).exists() if req.what.startswith("/") else shutil.which(req.what)
        if not found:
            out.append(req.package)
    return sorted(set(out))


def ensure_packages(progress: Progress) -> None:
    missing = missing_packages()
    if not missing:
        return
    progress(f"installing {' '.join(missing)} (apt-get)")
    # docker-registry's maintainer script would start the packaged registry
    # on every interface; policy-rc.d (exit 101) forbids service starts.
    policy = Path("/usr/sbin/policy-rc.d")
    created = False
    if not policy.exists():
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        created = True
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        for attempt in range(2):
            if attempt:
                _run(["apt-get", "update", "-q"], env=env)
            proc = subprocess.run(
                ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                env=env,
                capture_output=True,
                text=True,
            )
            if proc.returncode == 0:
                break
        else:
            raise HostSetupError(
                f"apt-get install {' '.join(missing)} failed:\n{proc.stderr[-2000:]}"
            )
    finally:
        if created:
            policy.unlink(missing_ok=True)
    still = missing_packages()
    if still:
        raise HostSetupError(f"still missing after apt-get: {', '.join(still)}")


def _run(argv: list[str], env: dict[str, str] | None = None, check: bool = True) -> str:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise HostSetupError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


# -- the pod bridge --------------------------------------------------------------
def bridge_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def ensure_bridge(name: str, address: str, prefix: int) -> None:
    """Create the bridge holding the host's address on the pod network.

    Made here rather than by the CNI plugin so that the kubelet can bind its
    node IP before the first pod exists.
    """
    if not bridge_exists(name):
        _run(["ip", "link", "add", name, "type", "bridge"])
    addrs = _run(["ip", "-o", "-4", "addr", "show", "dev", name])
    if f" {address}/{prefix} " not in addrs:
        _run(["ip", "addr", "add", f"{address}/{prefix}", "dev", name])
    _run(["ip", "link", "set", name, "up"])


def delete_bridge(name: str) -> None:
    if bridge_exists(name):
        # Ports still attached are veths of pods whose netns is gone; they go with it.
        for port in Path(f"/sys/class/net/{name}/brif").glob("*"):
            _run(["ip", "link", "del", port.name], check=False)
        _run(["ip", "link", "del", name])


def veths_on(bridge: str) -> list[str]:
    return sorted(p.name for p in Path(f"/sys/class/net/{bridge}/brif").glob("*"))


# -- cgroups ---------------------------------------------------------------------
def cgroup_mounts() -> list[Path]:
    """Mount points of every cgroup (v1) and cgroup2 hierarchy."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        fstype = right.split()[0]
        if fstype in ("cgroup", "cgroup2"):
            out.append(Path(left.split()[4]))
    return out


def ensure_cgroup_root(root: str) -> None:
    # The kubelet requires --cgroup-root to exist in every hierarchy.
    for mount in cgroup_mounts():
        (mount / root.lstrip("/")).mkdir(exist_ok=True)


def remove_cgroup_root(root: str, timeout_s: float = 10.0) -> list[str]:
    """rmdir the cgroup tree, deepest first; returns what could not be removed."""
    left: list[str] = []
    for mount in cgroup_mounts():
        top = mount / root.lstrip("/")
        if not top.is_dir():
            continue
        deadline = time.monotonic() + timeout_s
        while True:
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            busy = []
            for d in [*dirs, top]:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    busy.append(str(d))
            if not busy or time.monotonic() > deadline:
                left += busy
                break
            time.sleep(0.2)  # tasks still exiting
    return left


# -- mounts ----------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)
MNT_DETACH = 2


def mounts_under(path: Path) -> list[Path]:
    prefix = str(path.resolve())
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mnt = line.split(" - ", 1)[0].split()[4]
        mnt = mnt.encode().decode("unicode_escape")  # \040 for spaces
        if mnt == prefix or mnt.startswith(prefix + "/"):
            out.append(Path(mnt))
    return out


def unmount_under(path: Path) -> None:
    """Unmount everything at or below ``path``, deepest first.

    The kubelet bind-mounts its root dir onto itself and puts tmpfs volumes
    and overlay rootfs mounts beneath it; a stopped kubelet leaves them all.
    """
    for _ in range(5):
        mounts = sorted(set(mounts_under(path)), key=lambda p: -len(p.parts))
        if not mounts:
            return
        for m in mounts:
            if _libc.umount2(str(m).encode(), 0) != 0:
                _libc.umount2(str(m).encode(), MNT_DETACH)
    left = mounts_under(path)
    if left:
        raise HostSetupError(f"could not unmount: {', '.join(map(str, left))}")


# -- processes -------------------------------------------------------------------
def pids_with_arg(needle: str) -> list[int]:
    """Live processes whose command line contains ``needle`` (ours, by path)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(needle.encode() in part for part in cmd):
            out.append(int(entry))
    return out


def kill_processes_with_arg(needle: str, timeout_s: float = 5.0) -> list[int]:
    pids = pids_with_arg(needle)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while pids_with_arg(needle) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids_with_arg(needle):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids
