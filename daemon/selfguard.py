"""Keep the daemon's memory out of reach of the processes it runs.

The pristine record lives in the daemon's memory. A process of the same user
can read and write another's memory through ptrace or /proc/PID/mem as long
as the target is *dumpable*; a non-dumpable process can be attached to only
with CAP_SYS_PTRACE, which container runtimes do not grant and Sandman's
policy drops. See proc(5) and ptrace(2), "ptrace access mode checking".
(Read-mode views such as /proc/PID/environ and /proc/PID/maps stay readable
to the same user on current kernels: the token hash in the environment is
not a secret from the agent; see daemon/API.md, "Trust boundary".)

Python has no prctl(PR_SET_DUMPABLE) and the daemon's runtime has no
ctypes, but the kernel clears the flag itself (to fs.suid_dumpable: 0 or 2,
both not "user-dumpable") whenever a process's effective gid changes
(kernel/cred.c, commit_creds). A root daemon changes its effective gid away
and back once at start; its children exec and are dumpable as usual.
A non-root daemon cannot, and says so (daemon/API.md, "Trust boundary").
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("sandmand")

SUID_DUMPABLE = "/proc/sys/fs/suid_dumpable"
NOBODY_GID = 65534


def make_undumpable() -> bool:
    """True when the daemon is now non-dumpable (call before threads start)."""
    if os.geteuid() != 0:
        log.warning(
            "running as uid %d: cannot make the daemon non-dumpable; processes of "
            "the same user can read its memory",
            os.geteuid(),
        )
        return False
    try:
        with open(SUID_DUMPABLE) as f:
            mode = f.read().strip()
    except OSError:
        mode = "?"
    if mode == "1":
        log.warning("fs.suid_dumpable is 1 on this node: the daemon stays dumpable")
        return False
    egid = os.getegid()
    os.setegid(NOBODY_GID if egid != NOBODY_GID else NOBODY_GID - 1)
    os.setegid(egid)
    return True
