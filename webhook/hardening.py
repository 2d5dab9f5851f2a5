"""What an injected pod's containers may keep (pure: a pod and a rule set in, ops out).

A root agent with NET_RAW can forge ARP replies on the node's bridge and read
the clear-text traffic of its neighbours, other sandboxes' tokens included
(issue 15 item 8). Every container of a sandbox therefore loses every
capability the policy does not grant: it keeps ``defaultCapabilities`` (the
runtime's usual set minus NET_RAW unless the admin says otherwise) plus what
it asked for in ``capabilities.add`` and the policy allowed (the validating
webhook refuses the rest).

The drops are written as explicit names, not ``drop: [ALL]`` plus adds: a
pod that satisfies Pod Security ``restricted`` (``drop: [ALL]``, at most
NET_BIND_SERVICE added) is left as it is, and one that does not is not made
to look as if it did.
"""

from __future__ import annotations

from typing import Any

from sandman.webhook.confinement import capability
from sandman.webhook.policy import RuleSet

# Every capability of Linux 6.x (capabilities(7)), as Kubernetes names them.
ALL_CAPABILITIES = frozenset(
    {
        "AUDIT_CONTROL",
        "AUDIT_READ",
        "AUDIT_WRITE",
        "BLOCK_SUSPEND",
        "BPF",
        "CHECKPOINT_RESTORE",
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "IPC_LOCK",
        "IPC_OWNER",
        "KILL",
        "LEASE",
        "LINUX_IMMUTABLE",
        "MAC_ADMIN",
        "MAC_OVERRIDE",
        "MKNOD",
        "NET_ADMIN",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_RAW",
        "PERFMON",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYSLOG",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_CHROOT",
        "SYS_MODULE",
        "SYS_NICE",
        "SYS_PACCT",
        "SYS_PTRACE",
        "SYS_RAWIO",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "WAKE_ALARM",
    }
)


def _hardened(c: dict[str, Any], keep: frozenset[str]) -> dict[str, Any] | None:
    """The container's securityContext with the drops, or None if it needs none."""
    sc = dict(c.get("securityContext") or {})
    caps = dict(sc.get("capabilities") or {})
    dropped = [str(d) for d in caps.get("drop") or []]
    # A drop is read as containerd does ("CAP_" + upper case): CAP_ALL or
    # CAP_NET_RAW there drop nothing, so only bare names count as dropped.
    have = {d.upper() for d in dropped}
    if sc.get("privileged") or "ALL" in have:
        return None  # privileged (a policy allowed it) or already dropping everything
    added = {capability(a) for a in caps.get("add") or []}
    more = sorted(ALL_CAPABILITIES - keep - added - have)
    if not more:
        return None
    caps["drop"] = dropped + more
    sc["capabilities"] = caps
    return sc


def capability_ops(pod: dict[str, Any], rule: RuleSet) -> list[dict[str, Any]]:
    """JSON patch ops that drop what ``rule`` does not grant, on every container
    of ``pod`` as it is now (apply them before other ops shift indices)."""
    keep = frozenset(capability(n) for n in rule.default_capabilities)
    ops = []
    spec = pod.get("spec") or {}
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            sc = _hardened(c, keep)
            if sc is not None:
                ops.append({"op": "add", "path": f"/spec/{kind}/{i}/securityContext", "value": sc})
    return ops
