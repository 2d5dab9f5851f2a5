"""The policy checks on privilege and host access (pure), as Pod Security's
baseline level reads them, plus what only sandboxes need (probes aimed
elsewhere, a process namespace shared with the daemon).

Each function is one row of the denial table in docs/policy.md; ``checks.CHECKS``
puts them in order.
"""

from __future__ import annotations

from collections.abc import Iterator

from sandman.contract import DAEMON_INIT_CONTAINER, DAEMON_SHARED_VOLUME, DAEMON_VOLUME
from sandman.webhook.policy import Violation
from sandman.webhook.subject import Subject
from sandman.webhook.subject import security_context as _sc

# Pod Security's baseline lists (k8s.io/pod-security-admission v0.34, policy/
# check_sysctls.go and check_seLinuxOptions.go): sysctls namespaced and
# isolated per pod, and the SELinux types a container may run as.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
    }
)
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
# Deprecated annotations that some kubelets still honour.
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
SECCOMP_POD_ANNOTATION = "seccomp.security.alpha.kubernetes.io/pod"
SECCOMP_CONTAINER_ANNOTATION_PREFIX = "container.seccomp.security.alpha.kubernetes.io/"
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


def capability(name: str) -> str:
    """The kernel's name of a capability as the runtime reads it: containerd
    upper-cases it and adds ``CAP_``, so ``net_admin`` is ``NET_ADMIN``."""
    return str(name).upper().removeprefix("CAP_")


def privileged(s: Subject) -> Iterator[Violation]:
    if s.rule.allow_privileged:
        return
    for c in s.containers:
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            yield Violation(
                "privileged",
                f"container {c.get('name', '?')} is privileged",
                "remove securityContext.privileged",
            )
        if sc.get("allowPrivilegeEscalation"):
            yield Violation(
                "privilege-escalation",
                f"container {c.get('name', '?')} allows privilege escalation",
                "remove securityContext.allowPrivilegeEscalation",
            )


def capabilities(s: Subject) -> Iterator[Violation]:
    granted = {capability(n) for n in s.rule.allowed_capabilities}
    for c in s.containers:
        added = (_sc(c).get("capabilities") or {}).get("add") or []
        extra = sorted({str(n) for n in added if capability(n) not in granted})
        if extra:
            yield Violation(
                "capabilities",
                f"container {c.get('name', '?')} adds capabilities {extra}",
                "drop them from securityContext.capabilities.add "
                f"(allowed: {list(s.rule.allowed_capabilities)})",
            )


def host_namespaces(s: Subject) -> Iterator[Violation]:
    if s.rule.allow_host_namespaces:
        return
    for f in ("hostNetwork", "hostPID", "hostIPC"):
        if s.spec.get(f):
            yield Violation("host-namespaces", f"spec.{f} is set", f"remove spec.{f}")
    for who, sc in s.security_contexts:
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            yield Violation(
                "host-namespaces",
                f"{who} is a Windows HostProcess",
                "remove securityContext.windowsOptions.hostProcess",
            )


def share_process_namespace(s: Subject) -> Iterator[Violation]:
    if s.spec.get("shareProcessNamespace") and not s.rule.allow_share_process_namespace:
        yield Violation(
            "share-process-namespace",
            "spec.shareProcessNamespace is set (every container would see, signal and "
            "read the memory of the daemon and of each other)",
            "remove spec.shareProcessNamespace",
        )


def unconfined(s: Subject) -> Iterator[Violation]:
    """seccomp, AppArmor and SELinux, as Pod Security's baseline checks them."""
    if s.rule.allow_unconfined or s.rule.allow_privileged:
        return
    for who, sc in s.security_contexts:
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            yield Violation(
                "seccomp",
                f"{who} runs without seccomp (Unconfined)",
                "use seccompProfile type RuntimeDefault or Localhost",
            )
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            yield Violation(
                "apparmor",
                f"{who} runs without AppArmor (Unconfined)",
                "use appArmorProfile type RuntimeDefault or Localhost",
            )
        se = sc.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            yield Violation(
                "selinux",
                f"{who} sets SELinux options {se}",
                f"set only seLinuxOptions.type, one of {sorted(SELINUX_TYPES - {''})}",
            )
    for key, value in s.annotations.items():
        if key.startswith(APPARMOR_ANNOTATION_PREFIX) and not (
            value in ("", "runtime/default") or value.startswith("localhost/")
        ):
            yield Violation(
                "apparmor", f"annotation {key}={value!r}", "remove it or use runtime/default"
            )
        seccomp_key = key == SECCOMP_POD_ANNOTATION or key.startswith(
            SECCOMP_CONTAINER_ANNOTATION_PREFIX
        )
        if seccomp_key and not (
            value in ("runtime/default", "docker/default") or value.startswith("localhost/")
        ):
            yield Violation(
                "seccomp", f"annotation {key}={value!r}", "remove it or use runtime/default"
            )


def proc_mount(s: Subject) -> Iterator[Violation]:
    if s.rule.allow_privileged:
        return
    for c in s.containers:
        mount = _sc(c).get("procMount")
        if mount not in (None, "Default"):
            yield Violation(
                "proc-mount",
                f"container {c.get('name', '?')} asks for procMount {mount!r}",
                "remove securityContext.procMount (the masked /proc is the default)",
            )


def sysctl_allowed(name: str, patterns: tuple[str, ...]) -> bool:
    if name in SAFE_SYSCTLS:
        return True
    return any(name == p or (p.endswith(".*") and name.startswith(p[:-1])) for p in patterns)


def sysctls(s: Subject) -> Iterator[Violation]:
    for sysctl in (s.spec.get("securityContext") or {}).get("sysctls") or []:
        name = str(sysctl.get("name", ""))
        if not sysctl_allowed(name, s.rule.allowed_sysctls):
            yield Violation(
                "sysctls",
                f"sysctl {name!r} is not in the safe set",
                f"remove it, or ask an admin to list it in allowedSysctls "
                f"(safe: {', '.join(sorted(SAFE_SYSCTLS))})",
            )


def probe_host(s: Subject) -> Iterator[Violation]:
    """A probe or hook with ``host`` makes the kubelet connect from the node's
    network to any address the pod names (cloud metadata, another sandbox)."""
    for c in s.containers:
        handlers = [(p, c.get(p) or {}) for p in PROBES]
        handlers += [(f"lifecycle.{h}", v or {}) for h, v in (c.get("lifecycle") or {}).items()]
        for where, handler in handlers:
            for kind in ("httpGet", "tcpSocket"):
                host = (handler.get(kind) or {}).get("host") if isinstance(handler, dict) else None
                if host:
                    yield Violation(
                        "probe-host",
                        f"container {c.get('name', '?')}: {where}.{kind}.host is {host!r}",
                        f"remove {where}.{kind}.host (probes go to the pod itself)",
                    )


def host_ports(s: Subject) -> Iterator[Violation]:
    if s.rule.allow_host_ports:
        return
    for c in s.containers:
        if any(p.get("hostPort") for p in c.get("ports") or []):
            yield Violation(
                "host-ports",
                f"container {c.get('name', '?')} uses a hostPort",
                "remove ports[].hostPort",
            )


def host_paths(s: Subject) -> Iterator[Violation]:
    if s.rule.allow_host_paths:
        return
    for vol in s.spec.get("volumes") or []:
        path = (vol.get("hostPath") or {}).get("path")
        ours = vol.get("name") == DAEMON_SHARED_VOLUME and path in s.trusted_host_paths
        if "hostPath" in vol and not ours:
            yield Violation(
                "host-paths",
                f"volume {vol.get('name')} is a hostPath",
                "use an emptyDir or a PVC instead",
            )


def daemon_volumes(s: Subject) -> Iterator[Violation]:
    """The daemon's volumes stay the daemon's: a debug container must not mount
    the per-pod tree (it would change the daemon under the sandbox) nor the
    shared node directory (every sandbox of the node runs from it)."""
    for c in s.spec.get("ephemeralContainers") or []:
        for vm in c.get("volumeMounts") or []:
            if vm.get("name") in (DAEMON_VOLUME, DAEMON_SHARED_VOLUME):
                yield Violation(
                    "daemon-volume",
                    f"ephemeral container {c.get('name', '?')} mounts {vm.get('name')!r}, "
                    "the daemon's own volume",
                    "mount only the pod's own volumes",
                )
    for c in [*(s.spec.get("initContainers") or []), *(s.spec.get("containers") or [])]:
        if c.get("name") == DAEMON_INIT_CONTAINER:
            continue
        for vm in c.get("volumeMounts") or []:
            if vm.get("name") == DAEMON_SHARED_VOLUME and not vm.get("readOnly"):
                yield Violation(
                    "daemon-volume",
                    f"container {c.get('name', '?')} mounts the daemon's node directory writable",
                    "leave the mount read-only, as the webhook wrote it",
                )
