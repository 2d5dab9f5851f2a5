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
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
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
    # Services and NetworkPolicy on the real node: kube-proxy (iptables mode,
    # conntrack to flush UDP flows), kube-router (iptables + ipset), our
    # egress guard (an nftables table).
    Requirement("iptables", "iptables"),
    Requirement("ipset", "ipset"),
    Requirement("conntrack", "conntrack"),
    Requirement("nft", "nftables"),
    # `sandman image push`: registries with auth and TLS.
    Requirement("skopeo", "skopeo"),
    # The controller image's base layer is made from these (harness/images/pybase.py).
    Requirement("/usr/bin/python3.11", "python3.11"),
    Requirement("/etc/ssl/certs/ca-certificates.crt", "ca-certificates"),
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


def missing_packages(requirements: Sequence[Requirement] = REQUIREMENTS) -> list[str]:
    out = []
    for req in requirements:
        found = Path(req.what).exists() if req.what.startswith("/") else shutil.which(req.what)
        if not found:
            out.append(req.package)
    return sorted(set(out))


def ensure_packages(progress: Progress, requirements: Sequence[Requirement] = REQUIREMENTS) -> None:
    missing = missing_packages(requirements)
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
    still = missing_packages(requirements)
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


def route_via_bridge(name: str, cidr: str, src: str) -> None:
    """Send ``cidr`` (the Service range) into the bridge, never out of eth0.

    kube-proxy rewrites ClusterIPs that exist before routing; this route
    keeps an address of the range that is no Service on the machine (it
    would otherwise follow the default route), and gives the host's own
    connections to Services the bridge address as their source.
    """
    _run(["ip", "route", "replace", cidr, "dev", name, "src", src])


def enable_bridge_forwarding(name: str) -> None:
    """Forwarding on the pod bridge only (ip_forward and conf.all stay as they are).

    A pod calling a ClusterIP is DNATed to another pod on the same bridge:
    that is routing. The egress guard keeps it from reaching anywhere else.
    """
    Path(f"/proc/sys/net/ipv4/conf/{name}/forwarding").write_text("1\n")


BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


def ensure_bridge_netfilter() -> None:
    """Bridged pod-to-pod traffic must traverse iptables: kube-proxy's reverse
    NAT for a ClusterIP hairpin and kube-router's policy rules both rely on it
    (with it off, a NetworkPolicy is silently bypassed on the bridge)."""
    if not BRIDGE_NF.exists():
        raise HostSetupError(
            f"{BRIDGE_NF} missing: the kernel's br_netfilter is not loaded "
            "(modprobe br_netfilter); NetworkPolicy and Services need it"
        )
    if BRIDGE_NF.read_text().strip() != "1":
        BRIDGE_NF.write_text("1\n")


GUARD_TABLE = "sandman-guard"


def guard_ruleset(bridge: str) -> str:
    """An nftables table that drops forwarded packets from the pod bridge to
    anywhere but the bridge. Its own table at priority filter - 10, because
    kube-proxy and kube-router ACCEPT in iptables' FORWARD chain (and
    kube-router keeps moving its jump to the top), which would skip a rule of
    ours there."""
    return (
        f"table inet {GUARD_TABLE} {{\n"
        "  chain forward {\n"
        "    type filter hook forward priority filter - 10; policy accept;\n"
        f'    iifname "{bridge}" oifname != "{bridge}" counter drop\n'
        "  }\n"
        "}\n"
    )


def ensure_egress_guard(bridge: str) -> None:
    remove_egress_guard()
    proc = subprocess.run(
        ["nft", "-f", "-"], input=guard_ruleset(bridge), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise HostSetupError(f"nft: {proc.stderr.strip()}")


def remove_egress_guard() -> None:
    subprocess.run(["nft", "delete", "table", "inet", GUARD_TABLE], capture_output=True)


def egress_guard_present() -> bool:
    proc = subprocess.run(["nft", "list", "table", "inet", GUARD_TABLE], capture_output=True)
    return proc.returncode == 0


# -- what kube-router and kube-proxy leave behind --------------------------------
KUBE_ROUTER_CHAIN_PREFIXES = ("KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-")
KUBE_ROUTER_SET_PREFIXES = ("KUBE-SRC-", "KUBE-DST-")


def kube_router_cleanup_commands(filter_table: str, ipsets: list[str]) -> list[list[str]]:
    """The commands that remove kube-router's rules, given ``iptables-save -t
    filter`` and ``ipset list -n`` output (pure; v2.1.0 leaves its rules on
    SIGTERM, and its own --cleanup-config removes nothing, then panics)."""
    cmds: list[list[str]] = []
    chains: list[str] = []
    for line in filter_table.splitlines():
        if line.startswith(":") and line[1:].split(" ", 1)[0].startswith(
            KUBE_ROUTER_CHAIN_PREFIXES
        ):
            chains.append(line[1:].split(" ", 1)[0])
        elif line.startswith(("-A INPUT ", "-A FORWARD ", "-A OUTPUT ")) and line.split()[
            -1
        ].startswith("KUBE-ROUTER-"):
            cmds.append(["iptables", "-t", "filter", "-D", *shlex.split(line)[1:]])
    cmds += [["iptables", "-t", "filter", "-F", c] for c in chains]
    cmds += [["iptables", "-t", "filter", "-X", c] for c in chains]
    cmds += [["ipset", "destroy", s] for s in ipsets if s.startswith(KUBE_ROUTER_SET_PREFIXES)]
    return cmds


def remove_kube_router_rules() -> list[str]:
    """Run the cleanup; returns the commands that failed (for a warning)."""
    save = subprocess.run(["iptables-save", "-t", "filter"], capture_output=True, text=True)
    sets = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True)
    if save.returncode != 0:
        return ["iptables-save: " + save.stderr.strip()]
    failed = []
    for cmd in kube_router_cleanup_commands(save.stdout, sets.stdout.split()):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            failed.append(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return failed


def remove_kube_proxy_rules(kube_proxy: Path) -> list[str]:
    """``kube-proxy --cleanup`` (iptables, ip6tables and nftables modes), then
    the empty KUBE-FIREWALL chain and jumps it leaves in both families."""
    failed = []
    proc = subprocess.run([str(kube_proxy), "--cleanup"], capture_output=True, text=True)
    if proc.returncode != 0:
        failed.append(f"kube-proxy --cleanup: {proc.stderr.strip()[-300:]}")
    for ipt in ("iptables", "ip6tables"):
        for chain in ("INPUT", "OUTPUT"):
            while (
                subprocess.run(
                    [ipt, "-D", chain, "-j", "KUBE-FIREWALL"], capture_output=True
                ).returncode
                == 0
            ):
                pass
        subprocess.run([ipt, "-F", "KUBE-FIREWALL"], capture_output=True)
        subprocess.run([ipt, "-X", "KUBE-FIREWALL"], capture_output=True)
    return failed


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
