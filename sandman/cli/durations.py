"""One parser for every duration flag of the CLI (pure).

Every flag that takes a time (``--ttl``, ``--idle-timeout``, ``--timeout``,
``--wait``, ``--start-timeout``, ``extend POD DURATION``, ...) accepts the
same forms, so nobody has to remember which flag wants seconds and which a
Go duration:

    >>> parse_seconds("90")        # plain seconds (what the old flags took)
    90.0
    >>> parse_seconds("1.5")
    1.5
    >>> parse_seconds("5m")
    300.0
    >>> parse_seconds("1h30m")
    5400.0
    >>> parse_seconds("500ms")
    0.5
    >>> parse_seconds("2d")
    172800.0

Leases (``--ttl``, ``--idle-timeout``, ``extend``) go onto the pod as
annotation text, which the webhook and the reaper parse as Go-style
durations: :func:`lease_text` keeps a unit-bearing value as typed and gives a
plain number its ``s`` (``"90"`` -> ``"90s"``).

The argparse ``type=`` callables turn a bad value into argparse's usage error
(exit code 2) naming the flag and the accepted forms.
"""

from __future__ import annotations

import argparse
import re

from sandman.contract import MAX_DURATION, duration_seconds

FORMS = "e.g. 90, 90s, 5m, 1h30m, 500ms, 2d"
# Plain seconds, besides the Go-style forms the webhook and the reaper read
# (contract.duration_seconds).
_PLAIN = re.compile(r"[0-9]+(?:\.[0-9]+)?", re.ASCII)


def parse_seconds(text: str, *, zero_ok: bool = False, what: str = "duration") -> float:
    """``text`` in seconds; ValueError naming ``what`` and the accepted forms."""
    value = text.strip() if isinstance(text, str) else text
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what}: empty; use {FORMS}")
    if _PLAIN.fullmatch(value):
        seconds = float(value)
    elif (go := duration_seconds(value)) is not None:
        seconds = go
    else:
        raise ValueError(f"{what}: {text!r} is not a duration; use {FORMS}")
    if seconds == 0 and not zero_ok:
        raise ValueError(f"{what}: must be more than zero, got {text!r}")
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"{what}: {text!r} is out of range; use at most 3650d")
    return seconds


def lease_text(text: str, *, what: str = "duration") -> str:
    """A lease for an annotation: validated, and a plain number given its ``s``."""
    value = text.strip()
    parse_seconds(value, what=what)
    return f"{value}s" if _PLAIN.fullmatch(value) else value


def seconds(text: str) -> float:
    """argparse type: a positive duration, in seconds."""
    try:
        return parse_seconds(text, what="duration")
    except ValueError as e:
        raise argparse.ArgumentTypeError(_plain(e)) from None


def seconds_or_zero(text: str) -> float:
    """argparse type: a duration that may be zero (``--wait 0``: do not wait)."""
    try:
        return parse_seconds(text, zero_ok=True, what="duration")
    except ValueError as e:
        raise argparse.ArgumentTypeError(_plain(e)) from None


def lease(text: str) -> str:
    """argparse type: a lease (TTL, idle timeout) as annotation text."""
    try:
        return lease_text(text, what="duration")
    except ValueError as e:
        raise argparse.ArgumentTypeError(_plain(e)) from None


def _plain(e: Exception) -> str:
    # argparse prefixes "argument --ttl: "; drop our own "duration: ".
    return str(e).removeprefix("duration: ")
