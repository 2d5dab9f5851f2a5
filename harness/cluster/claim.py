"""Who owns this machine's real node: a claim file, taken and checked under a lock.

The real node uses host-global things (the bridge ``sandman0`` and its
address, which the apiserver binds; iptables rules; the nftables guard;
ports 5000/10250; the cgroup root), so one cluster at a time may have it.
Failure this prevents (seen): two test sessions that both waited for the
bridge to disappear saw it gone at the same moment and both started a real
node on it; the one that failed then tore down "its" bridge and iptables
rules, which were the other's, and cut the survivor's apiserver off.

The claim is ``/run/sandman/real-node``: the owning cluster's state dir and
the time of the claim, written under ``flock`` so check-and-take is atomic.
It is released by that cluster's ``down``. A claim is stale (and may be
taken over) when its state dir is gone, or when none of that cluster's
processes runs and it is older than CLAIM_GRACE_S (a fresh claim has no
processes yet). Teardown of host-global state is done only by the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

CLAIM_DIR = Path(os.environ.get("SANDMAN_REAL_NODE_CLAIM_DIR", "/run/sandman"))
# A cluster takes well under this from its claim to its first process (the
# registry); past it, a claim with nothing running is a leftover of a crash.
CLAIM_GRACE_S = 600.0


def _claim_file() -> Path:
    return CLAIM_DIR / "real-node"


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    CLAIM_DIR.mkdir(parents=True, exist_ok=True)
    with open(CLAIM_DIR / "real-node.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _read() -> dict[str, object] | None:
    try:
        return dict(json.loads(_claim_file().read_text()))
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _runs(state_dir: Path) -> bool:
    """Any process of that cluster alive, by its pid files (``<state>/run/*.pid``)."""
    for pid_file in (state_dir / "run").glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            if _alive(int(pid_file.read_text().split()[0])):
                return True
    return False


def holder_if_live(now: float | None = None) -> str | None:
    """The state dir of the cluster holding the real node, unless the claim is stale."""
    claim = _read()
    if claim is None:
        return None
    state = Path(str(claim.get("state_dir", "")))
    if not state.is_dir():
        return None
    age = (now if now is not None else time.time()) - float(claim.get("since", 0.0))  # type: ignore[arg-type]
    if _runs(state) or age < CLAIM_GRACE_S:
        return str(state)
    return None


def take(state_dir: Path) -> str | None:
    """Claim the real node for ``state_dir``; returns None on success (or if it
    already holds it), else the holder's state dir."""
    mine = str(state_dir.resolve())
    with _locked():
        holder = holder_if_live()
        if holder is not None and holder != mine:
            return holder
        if holder != mine:
            tmp = _claim_file().with_suffix(".tmp")
            tmp.write_text(
                json.dumps({"state_dir": mine, "since": time.time(), "pid": os.getpid()})
            )
            tmp.replace(_claim_file())
    return None


def held_by(state_dir: Path) -> bool:
    claim = _read()
    return claim is not None and claim.get("state_dir") == str(state_dir.resolve())


def release(state_dir: Path) -> None:
    with _locked():
        if held_by(state_dir):
            _claim_file().unlink(missing_ok=True)
