"""Draw a Grafana dashboard's panels as one PNG from query results (matplotlib, ``[plot]``).

Not Grafana: a static rendering of the same dashboard file, laid out on the
same 24-column grid, for docs and reports where no Grafana runs. The caller
evaluates each panel's queries (e.g. with Prometheus over recorded samples)
and passes, per panel id, a list of series ``(legend, [(t, value), ...])``;
``timeseries`` panels draw lines, ``stat`` panels the last value, ``table``
panels one row per series.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Series = tuple[str, Sequence[tuple[float, float]]]
ROW_H = 0.55  # grid units a row header takes (Grafana's rows are 1 unit, mostly air)
LINES, LEGEND = 10, 6  # series drawn per graph, and named in its legend (two rows)


def legend(fmt: str, labels: Mapping[str, str]) -> str:
    """Grafana's legendFormat: ``{{label}}`` replaced by the series' label value."""
    if not fmt:
        inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return "{" + inner + "}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def fmt_value(v: float, unit: str) -> str:
    if math.isnan(v):
        return "n/a"
    if unit == "s":
        return f"{v * 1000:.1f} ms" if abs(v) < 1 else f"{v:.2f} s"
    if unit == "percentunit":
        return f"{v * 100:.0f}%"
    if unit == "d":
        return f"{v:.1f} days"
    if unit in ("reqps", "ops"):
        return f"{v:.2f}/s"
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}"


def render(
    dashboard: Mapping[str, Any],
    results: Mapping[int, Sequence[Series]],
    out: Path,
    *,
    span: tuple[float, float] | None = None,
    subtitle: str = "",
    col_px: float = 80.0,
    unit_px: float = 30.0,
) -> Path:
    """Draw every panel; ``span`` (unix seconds) is the time range all graphs share."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    panels = list(dashboard["panels"])
    # Grafana's rows take a whole grid unit; here a thinner band, so y moves.
    ys: dict[int, float] = {}
    shift = 0.0
    for p in sorted(panels, key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"])):
        g = p["gridPos"]
        ys[p["id"]] = g["y"] - shift
        if p["type"] == "row":
            shift += g["h"] - ROW_H
    bottom = max(ys[p["id"]] + (ROW_H if p["type"] == "row" else p["gridPos"]["h"]) for p in panels)
    top = 1.8  # grid units for the title band
    W, H = 24 * col_px, (bottom + top + 0.3) * unit_px
    fig = plt.figure(figsize=(W / 100, H / 100), dpi=100, facecolor="#111217")
    fig.text(
        8 / W,
        1 - 8 / H,
        dashboard.get("title", ""),
        color="white",
        fontsize=16,
        weight="bold",
        va="top",
    )
    if subtitle:
        fig.text(8 / W, 1 - 34 / H, subtitle, color="#9fa7b3", fontsize=9, va="top")

    def rect(x: float, y: float, w: float, h: float) -> list[float]:
        """Pixels from the top-left corner -> a figure fraction [l, b, w, h]."""
        return [x / W, 1 - (y + h) / H, w / W, h / H]

    colors = [
        "#73bf69",
        "#f2cc0c",
        "#5794f2",
        "#ff9830",
        "#f2495c",
        "#b877d9",
        "#8ab8ff",
        "#fade2a",
        "#96d98d",
        "#ffa6b0",
    ]
    t0 = t1 = None
    if span is not None:
        t0, t1 = (dt.datetime.fromtimestamp(t, dt.UTC) for t in span)
    for p in panels:
        g = p["gridPos"]
        x = g["x"] * col_px + 3
        y = (top + ys[p["id"]]) * unit_px + 3
        w = g["w"] * col_px - 6
        if p["type"] == "row":
            fig.text(
                (x + 2) / W,
                1 - (y + ROW_H * unit_px / 2) / H,
                p["title"],
                color="#d8d9da",
                fontsize=11,
                weight="bold",
                va="center",
            )
            continue
        h = g["h"] * unit_px - 6
        frame = fig.add_axes(rect(x, y, w, h), facecolor="#181b1f")
        frame.set_xticks([])
        frame.set_yticks([])
        for sp in frame.spines.values():
            sp.set_color("#2c3235")
        frame.text(
            6 / w,
            1 - 5 / h,
            p["title"],
            color="#d8d9da",
            fontsize=9,
            weight="bold",
            va="top",
            transform=frame.transAxes,
        )
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        series = [
            (name, pts)
            for name, pts in results.get(p["id"], [])
            if any(not math.isnan(v) for _, v in pts)
        ]
        if not series:
            frame.text(
                0.5,
                0.45,
                "No data",
                color="#6e7681",
                ha="center",
                va="center",
                transform=frame.transAxes,
            )
            continue
        if p["type"] == "stat":
            last = next(v for _, v in reversed(series[0][1]) if not math.isnan(v))
            frame.text(
                0.5,
                0.42,
                fmt_value(last, unit),
                color="#73bf69",
                fontsize=20,
                weight="bold",
                ha="center",
                va="center",
                transform=frame.transAxes,
            )
            continue
        if p["type"] == "table":
            for i, name in enumerate(sorted(n for n, _ in series)[:8]):
                frame.text(
                    0.04,
                    0.78 - i * 0.11,
                    name,
                    color="#d8d9da",
                    fontsize=7,
                    transform=frame.transAxes,
                    family="monospace",
                )
            continue
        ax = fig.add_axes(rect(x + 58, y + 22, w - 66, h - 22 - 40), facecolor="#181b1f")
        for sp in ax.spines.values():
            sp.set_visible(False)
        for i, (name, pts) in enumerate(series[:LINES]):
            xs = [dt.datetime.fromtimestamp(t, dt.UTC) for t, _ in pts]
            ax.plot(
                xs,
                [v for _, v in pts],
                color=colors[i % len(colors)],
                linewidth=1.2,
                label=name[:48],
            )
        if t0 is not None:
            ax.set_xlim(t0, t1)
        ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))
        ax.tick_params(colors="#9fa7b3", labelsize=7, length=0)
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        ax.xaxis.set_major_locator(mdates.SecondLocator(bysecond=(0, 30)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos, u=unit: fmt_value(v, u)))
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(4))
        ax.grid(color="#2c3235", linewidth=0.5)
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(
            handles[:LEGEND],
            labels[:LEGEND],
            loc="upper left",
            bbox_to_anchor=(0, -0.12),
            fontsize=6,
            frameon=False,
            labelcolor="#d8d9da",
            ncol=3,
            handlelength=1.2,
            columnspacing=1.0,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, facecolor=fig.get_facecolor())
    plt.close(fig)
    return out
