"""Idle detection: when was a sandbox's daemon last used?

The daemon knows (``GET /v1/idle``: seconds since it was last used, 0 while a
request or stream is open; no token needed and nothing else revealed, so the
reaper holds no sandbox's token and sends none across the node's network);
the
reaper asks only when it matters, i.e. when a sandbox would be idle for its
whole timeout if nothing happened since the last answer. So an active fleet
costs no polls and a heartbeat costs no control-plane write (design
section 6).

Unreachable daemons: a single failed poll never counts (a restart, a network
blip); a daemon unreachable for longer than the idle timeout does.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from sandman.contract import DAEMON_PORT, MAX_DURATION

# A status poll should take milliseconds; a daemon slower than this is as good
# as unreachable for the purpose of this one poll.
POLL_TIMEOUT_S = 3.0
# The daemon answers ``{"idle_s": N}`` in a few dozen bytes. What the reaper
# reads is bounded because the answer comes from inside a sandbox: an agent
# that replaced the daemon's files could answer gigabytes to a reaper that
# polls thousands of sandboxes.
MAX_IDLE_BODY = 4096
# No lease or idle timeout is longer (contract.parse_duration's cap); a larger
# figure is not an answer, and would overflow the reaper's datetime arithmetic.
MAX_IDLE_S = MAX_DURATION.total_seconds()


@dataclass
class IdleState:
    last_active: dt.datetime | None = None  # reaper clock
    unreachable_since: dt.datetime | None = None
    polls: int = 0


@dataclass
class IdleTracker:
    """Per-sandbox idle knowledge. Event-loop only (not thread-safe)."""

    states: dict[str, IdleState] = field(default_factory=dict)

    def state(self, key: str) -> IdleState:
        return self.states.setdefault(key, IdleState())

    def forget(self, key: str) -> None:
        self.states.pop(key, None)

    def idle_since(self, key: str, ready_since: dt.datetime | None) -> dt.datetime | None:
        """The instant idleness is measured from (None: unknown, not Ready yet)."""
        st = self.states.get(key)
        if st is not None and st.unreachable_since is not None:
            return st.unreachable_since
        if st is not None and st.last_active is not None:
            return st.last_active
        return ready_since

    def observed(self, key: str, now: dt.datetime, idle_s: float) -> None:
        st = self.state(key)
        st.polls += 1
        st.unreachable_since = None
        st.last_active = now - dt.timedelta(seconds=max(0.0, idle_s))

    def failed(self, key: str, now: dt.datetime) -> bool:
        """Record a failed poll; True if this was the first of a run of failures."""
        st = self.state(key)
        st.polls += 1
        if st.unreachable_since is None:
            st.unreachable_since = now
            return True
        return False


# A daemon from before GET /v1/idle answers 404: its idleness cannot be
# observed without a token, so it is never reclaimed for idleness (its lease
# still applies).
IDLE_UNSUPPORTED = -1.0


def parse_idle(body: bytes) -> float | None:
    """The ``idle_s`` of a ``/v1/idle`` answer; None for anything else (not
    JSON, JSON nested past the parser's depth, not a finite number from 0 to
    ``MAX_IDLE_S``): an unknown, never an exception in the reaper's loop."""
    try:
        idle = float(json.loads(body)["idle_s"])
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None
    return idle if math.isfinite(idle) and 0 <= idle <= MAX_IDLE_S else None


async def poll_idle_seconds(
    http: aiohttp.ClientSession, pod: dict[str, Any], *, port: int = DAEMON_PORT
) -> float | None:
    """``idle_s`` from the sandbox's daemon; None if it could not be asked or
    gave no usable answer; ``IDLE_UNSUPPORTED`` if its daemon has no idle figure."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    try:
        async with http.get(
            f"http://{ip}:{port}/v1/idle",
            timeout=aiohttp.ClientTimeout(total=POLL_TIMEOUT_S),
            allow_redirects=False,
        ) as r:
            if r.status == 404:
                return IDLE_UNSUPPORTED
            if r.status != 200:
                return None
            body = b""
            while len(body) <= MAX_IDLE_BODY:
                chunk = await r.content.read(MAX_IDLE_BODY + 1 - len(body))
                if not chunk:
                    return parse_idle(body)
                body += chunk
            return None  # too long; leaving the block drops the connection unread
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None
