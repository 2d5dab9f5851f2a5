"""The run report's timeline: what is drawn (pure) and the PNG itself, opened and looked at."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from PIL import Image

from sandman.fleet.plot import (
    BUSY,
    IDLE,
    QUARANTINED,
    WALL,
    WARMING,
    panel,
    sample,
    segments,
    time_extent,
    timeline_png,
)
from sandman.fleet.records import Attempt, Outcome, RolloutRecord, RunData, SandboxSpan, Source


def run(strategy: str, n_spans: int, reuse: bool = False) -> RunData:
    spans = [
        SandboxSpan(f"sb-{i}", f"p{i % 3}", Source.CLAIMED if i % 2 else Source.CREATED,
                    t_created=i * 0.1, t_ready=i * 0.1 + 1.0,
                    t_claimed=i * 0.1 + 2.0 if i % 2 else None,
                    t_released=i * 0.1 + 4.0 if i % 5 else None, quarantined=i % 7 == 3)
        for i in range(n_spans)
    ]  # fmt: skip
    records = [
        RolloutRecord("p0", 0, Outcome.OK, 1.0, [Attempt(Source.CREATED, "sb-0", 0.0, t_done=5.0)])
    ]
    return RunData(strategy, reuse, 3, 2, 4, records=records, spans=spans, t_end=9.0)


def pixels(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"), dtype=np.int16)


def share_of(img: np.ndarray, colour: str) -> float:
    """Fraction of pixels within a small distance of ``colour`` (antialiasing blurs edges)."""
    rgb = np.array([round(c * 255) for c in to_rgb(colour)], dtype=np.int16)
    return float((np.abs(img - rgb).sum(axis=2) <= 12).mean())


def test_segments_follow_a_sandboxs_phases() -> None:
    pool = SandboxSpan("a", "p", Source.CLAIMED, t_created=1.0, t_ready=2.0, t_claimed=3.0)
    # warming 1->2, idle in the pool 2->3, busy from the claim 3 to the end 5.
    assert segments(pool, 5.0) == [(1.0, 2.0, "warming"), (2.0, 3.0, "idle"), (3.0, 5.0, "busy")]
    made = SandboxSpan("b", "p", Source.CREATED, t_created=1.0, t_ready=2.5)
    assert segments(made, 4.0) == [(1.0, 2.5, "warming"), (2.5, 4.0, "busy")]  # no pool: no idle
    never_ready = SandboxSpan("c", "p", Source.CREATED, t_created=1.0)
    assert segments(never_ready, 3.0) == [(1.0, 3.0, "warming")]


def test_rows_are_sampled_evenly_and_ordered_by_creation() -> None:
    spans = run("pool", 1000).spans
    rows = sample(list(reversed(spans)), 10)
    # every 100th of 1000 creation-ordered spans: sb-0, sb-100, ..., sb-900
    assert [s.name for s in rows] == [f"sb-{i}" for i in range(0, 1000, 100)]
    assert sample(spans[:3], 10) == spans[:3]


def test_panel_collects_segments_per_colour_and_marks() -> None:
    data = run("pool", 10)
    p = panel(data, time_extent([data]), max_rows=400)
    assert len(p.rows) == 10 and p.wall == 5.0
    assert [row for row, _ in p.quarantined] == [3]  # i % 7 == 3
    assert len(p.segments[WARMING]) == 10 and len(p.segments[IDLE]) == 5  # odd = pool pods
    assert "sampled" not in p.title
    assert "(sampled 4 of 10)" in panel(data, 9.0, max_rows=4).title


def test_timeline_png_opens_with_the_size_asked_and_drawn_axes(tmp_path: Path) -> None:
    runs = [run("pool", 20, reuse=True), run("on-demand", 5)]
    path = timeline_png(runs, tmp_path / "plots" / "timeline.png")
    img = pixels(path)
    height, width, _ = img.shape
    assert width == 1200 and 200 < height < 2000
    # The axes are not blank: the bars make the plot area vary, and each phase
    # colour covers a visible share of it (not just a legend swatch).
    plot_area = img[60 : height - 50, 30 : width - 30]
    assert plot_area.std() > 20
    for colour in (WARMING, IDLE, BUSY):
        assert share_of(plot_area, colour) > 0.005, colour
    assert share_of(img, WALL) > 0
    assert share_of(img, QUARANTINED) > 0


def test_thousands_of_sandboxes_are_sampled_to_a_bounded_image(tmp_path: Path) -> None:
    small = pixels(timeline_png(run("pool", 50), tmp_path / "small.png", max_rows=100))
    big = pixels(timeline_png(run("pool", 5000), tmp_path / "big.png", max_rows=100))
    assert big.shape[0] < small.shape[0] + 200
    narrow = pixels(timeline_png(run("pool", 50), tmp_path / "narrow.png", width=600))
    assert narrow.shape[1] == 600


@pytest.mark.parametrize("what", ["empty", "none", "mixed"])
def test_empty_runs_still_give_a_picture(tmp_path: Path, what: str) -> None:
    empty = RunData("on-demand", False, 0, 0, 1)
    data = {"empty": empty, "none": [], "mixed": [empty, run("pool", 3)]}[what]
    img = pixels(timeline_png(data, tmp_path / f"{what}.png"))
    assert img.shape[1] == 1200 and img.shape[0] > 0
