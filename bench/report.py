"""Printing and saving benchmark results (one shape for every benchmark)."""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sandman import stats


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values (JSON-friendly
    tables print it as nan rather than failing)."""
    v = stats.percentile(values, q)
    return math.nan if v is None else v


def table(title: str, rows: Sequence[tuple[str, Any]]) -> str:
    width = max(len(k) for k, _ in rows)
    lines = [title, "-" * len(title)]
    for k, v in rows:
        shown = f"{v:.3f}" if isinstance(v, float) else str(v)
        lines.append(f"{k:<{width}}  {shown}")
    return "\n".join(lines)


def write_json(
    path: Path,
    name: str,
    results: dict[str, Any],
    *,
    conditions: dict[str, Any] | None = None,
) -> None:
    """``conditions``: the machine's load average and the clusters running at
    the benchmark's start and end (`sandman bench` passes them), so a figure is
    read with how busy the machine was."""
    doc = {
        "benchmark": name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        **({"conditions": conditions} if conditions is not None else {}),
        **results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
