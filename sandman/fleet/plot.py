"""A PNG timeline of fleet runs: one row per sandbox, one panel per run (matplotlib).

Needs the ``[plot]`` extra; matplotlib is imported only when a plot is drawn,
so the SDK, the CLI and the report tables run without it. All panels share
one time axis, so strategies compare by eye. What to draw (rows, sampling,
coloured segments) is decided by pure functions; ``timeline_png`` only
hands their output to matplotlib (the Agg canvas: no display, no pyplot
global state).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sandman.fleet.records import RunData, SandboxSpan, Source
from sandman.fleet.report import span_end, wall_time_s

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# Colours (matplotlib hex) of a sandbox's phases and the markers.
WARMING = "#f5b041"
IDLE = "#a5cdf0"
BUSY = "#2869b9"
QUARANTINED = "#d72323"
WALL = "#8228aa"
COLOURS = {"warming": WARMING, "idle": IDLE, "busy": BUSY}
LEGEND = (("warming", WARMING), ("idle in pool", IDLE), ("busy", BUSY),
          ("quarantined", QUARANTINED), ("wall", WALL))  # fmt: skip

DPI = 100
# Pixels per sandbox row, at most: a handful of sandboxes still gets readable
# bars, while a run of thousands is sampled down to ``max_rows`` rows.
ROW_MAX_PX = 6
# Every panel gets at least this much room for its title and a few rows.
PANEL_MIN_PX = 60
HEADER_PX = 70  # legend + axis label


@dataclass(frozen=True)
class Panel:
    """What one run's panel shows (pure data; ``timeline_png`` draws it)."""

    title: str
    rows: list[SandboxSpan]  # top to bottom
    segments: dict[str, list[tuple[int, float, float]]]  # colour -> (row, start, end)
    quarantined: list[tuple[int, float]]  # (row, end)
    wall: float | None


def time_extent(runs: Sequence[RunData]) -> float:
    times = [0.0]
    for run in runs:
        times += [t for t in (run.t_end, wall_time_s(run)) if t is not None]
        for s in run.spans:
            times += [t for t in (s.t_created, s.t_ready, s.t_claimed, s.t_released) if t]
        times += [r.final.t_done for r in run.records if r.final and r.final.t_done]
    return max(times) if max(times) > 0 else 1.0


def sample(spans: Sequence[SandboxSpan], max_rows: int) -> list[SandboxSpan]:
    ordered = sorted(spans, key=lambda s: (s.t_created, s.name))
    if len(ordered) <= max_rows:
        return ordered
    # Evenly spaced rows keep the shape of the whole run; the first N would show only its start.
    return [ordered[i * len(ordered) // max_rows] for i in range(max_rows)]


def segments(span: SandboxSpan, end: float) -> list[tuple[float, float, str]]:
    """(start, end, phase) of a sandbox's phases: warming, idle (in a pool), busy."""
    ready = span.t_ready
    out = [(span.t_created, ready if ready is not None else end, "warming")]
    if ready is None:
        return out
    if span.source is Source.CLAIMED:
        claimed = span.t_claimed
        out.append((ready, claimed if claimed is not None else end, "idle"))
        if claimed is not None:
            out.append((claimed, end, "busy"))
    else:
        out.append((ready, end, "busy"))
    return out


def panel_title(run: RunData, shown: int) -> str:
    wall = wall_time_s(run)
    title = f"{run.strategy} reuse={'on' if run.reuse else 'off'}  {len(run.spans)} sandboxes"
    title += f"  wall {wall:.1f}s" if wall is not None else "  wall -"
    if shown < len(run.spans):
        title += f"  (sampled {shown} of {len(run.spans)})"
    return title


def panel(run: RunData, t_max: float, max_rows: int) -> Panel:
    rows = sample(run.spans, max_rows)
    segs: dict[str, list[tuple[int, float, float]]] = {}
    quarantined = []
    for i, span in enumerate(rows):
        end = min(span_end(span, run.t_end), t_max)
        for t0, t1, phase in segments(span, end):
            if t1 > t0:
                segs.setdefault(COLOURS[phase], []).append((i, t0, t1))
        if span.quarantined:
            quarantined.append((i, end))
    return Panel(panel_title(run, len(rows)), rows, segs, quarantined, wall_time_s(run))


def panel_px(p: Panel, max_rows: int) -> int:
    row_px = max(1, min(ROW_MAX_PX, max_rows // max(1, len(p.rows))))
    return max(PANEL_MIN_PX, len(p.rows) * row_px + 30)


def _draw(ax: Axes, p: Panel, t_max: float) -> None:
    n = max(1, len(p.rows))
    for colour, segs in p.segments.items():
        ax.barh(
            [row for row, _, _ in segs],
            [t1 - t0 for _, t0, t1 in segs],
            left=[t0 for _, t0, _ in segs],
            height=0.85 if n <= 100 else 1.0,
            color=colour,
            linewidth=0,
        )
    if p.quarantined:
        ax.scatter([t for _, t in p.quarantined], [r for r, _ in p.quarantined],
                   marker="|", color=QUARANTINED, s=40, zorder=3)  # fmt: skip
    if p.wall is not None:
        ax.axvline(p.wall, color=WALL, linewidth=1.5)
    if not p.rows:
        ax.text(0.01, 0.5, "no sandboxes", transform=ax.transAxes, va="center")
    ax.set_xlim(0, t_max)
    ax.set_ylim(n - 0.5, -0.5)  # first sandbox on top
    ax.set_yticks([])
    ax.set_title(p.title, loc="left", fontsize=9)
    ax.grid(axis="x", color="#e4e4e4", linewidth=0.8)
    ax.set_axisbelow(True)


def timeline_png(
    data: RunData | Sequence[RunData], path: str | Path, *, width: int = 1200, max_rows: int = 400
) -> Path:
    """Draw the runs' timelines into a PNG of ``width`` pixels; returns the path."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as e:
        raise ImportError(
            f"the timeline plot needs matplotlib ({e}): pip install 'sandman-k8s[plot]'"
        ) from None
    runs = [data] if isinstance(data, RunData) else list(data)
    t_max = time_extent(runs)
    panels = [panel(run, t_max, max_rows) for run in runs] or [Panel("no runs", [], {}, [], None)]
    heights = [panel_px(p, max_rows) for p in panels]
    fig = Figure(figsize=(width / DPI, (sum(heights) + HEADER_PX) / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": heights})[:, 0]  # fmt: skip
    for ax, p in zip(axes, panels, strict=True):
        _draw(ax, p, t_max)
    axes[-1].set_xlabel("seconds since run start")
    fig.legend(handles=[Patch(color=c, label=label) for label, c in LEGEND],
               loc="upper center", ncol=len(LEGEND), frameon=False, fontsize=9)  # fmt: skip
    fig.subplots_adjust(left=0.02, right=0.99, top=1 - 40 / fig.bbox.height,
                        bottom=45 / fig.bbox.height, hspace=0.45)  # fmt: skip
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path
