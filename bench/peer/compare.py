"""Rows of the side-by-side comparison, their ratios and the issue's targets.

Pure. A row holds one figure for each system and whether lower or higher is
better; its ratio always says how many times better ours is, so above 1
means ours wins whether the row is a latency, a rate or a cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Better = Literal["lower", "higher"]


@dataclass(frozen=True)
class Row:
    key: str  # e.g. "cold_1_first_command_p50_ms"
    ours: float | None
    peer: float | None
    better: Better
    why_missing: str = ""  # when one side could not be measured

    @property
    def ratio(self) -> float | None:
        return ratio(self.ours, self.peer, self.better)


def ratio(ours: float | None, peer: float | None, better: Better) -> float | None:
    """How many times better ours is than the peer's (None without both figures).

    >>> ratio(100.0, 500.0, "lower")   # ours takes 100 ms, theirs 500 ms
    5.0
    >>> ratio(30.0, 20.0, "higher")    # ours 30/s, theirs 20/s
    1.5
    """
    if ours is None or peer is None or math.isnan(ours) or math.isnan(peer):
        return None
    num, den = (peer, ours) if better == "lower" else (ours, peer)
    if den == 0:
        return math.inf if num > 0 else 1.0
    return round(num / den, 3)


def json_keys(rows: list[Row]) -> dict[str, float | str | None]:
    """``ours_<key>``, ``peer_<key>`` and ``ratio_<key>`` for every row."""
    out: dict[str, float | str | None] = {}
    for r in rows:
        out[f"ours_{r.key}"] = r.ours
        out[f"peer_{r.key}"] = r.peer
        out[f"ratio_{r.key}"] = r.ratio
        if r.why_missing:
            out[f"missing_{r.key}"] = r.why_missing
    return out


@dataclass(frozen=True)
class Target:
    text: str
    keys: tuple[str, ...]  # rows whose ratio must reach ``at_least``
    at_least: float


TARGETS = (
    Target(
        "warm claim -> first command at least 5x faster than the peer's claim -> Ready "
        "(1, 8 and 32 at once, p50 and p99)",
        tuple(
            f"warm_{n}_claim_first_command_vs_ready_{q}_ms"
            for n in (1, 8, 32)
            for q in ("p50", "p99")
        ),
        5.0,
    ),
    Target(
        "cold create -> first command at least equal to the peer's create -> Ready (1, 16)",
        tuple(f"cold_{n}_first_command_vs_ready_p50_ms" for n in (1, 16)),
        1.0,
    ),
    Target(
        "burst: at least 1.5x the peer's completions per second",
        ("burst_claims_per_s", "burst_creates_per_s"),
        1.5,
    ),
    Target(
        "cost per lifecycle: at most half the peer's apiserver requests and apiserver CPU",
        ("lifecycle_apiserver_requests", "lifecycle_apiserver_cpu_s"),
        2.0,
    ),
    Target(
        "RL batch: at most the peer's pods created and wall time",
        ("rl_pods_created", "rl_wall_s"),
        1.0,
    ),
)


@dataclass(frozen=True)
class Verdict:
    target: str
    met: bool | None  # None: a row it needs was not measured
    short: list[str]  # "<key>: 3.1x (needs 5x)" for each row below its bar


def verdicts(rows: list[Row], targets: tuple[Target, ...] = TARGETS) -> list[Verdict]:
    by_key = {r.key: r for r in rows}
    out = []
    for t in targets:
        short: list[str] = []
        unknown = False
        for key in t.keys:
            r = by_key.get(key)
            val = r.ratio if r else None
            if val is None:
                unknown = True
                short.append(f"{key}: not measured")
            elif val < t.at_least:
                short.append(f"{key}: {val:g}x (needs {t.at_least:g}x)")
        met = None if unknown and not [s for s in short if "needs" in s] else not short
        out.append(Verdict(t.text, met, short))
    return out
