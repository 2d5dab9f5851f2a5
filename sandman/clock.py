"""The wall clock, read in one place.

Decisions take ``now`` (or a clock) from their caller, so tests pin one
instant and probe both sides of a boundary; this is the default those
callers pass when nothing else is injected. Standard library only.
"""

from __future__ import annotations

import datetime as dt


def utc_now() -> dt.datetime:
    """The current time, timezone-aware, in UTC."""
    return dt.datetime.now(dt.UTC)
