"""The static dashboard render: the real dashboard file drawn from given series,
checked by opening the PNG (size, panels drawn with data), not by hashing bytes."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np

from sandman.telemetry.render import fmt_value, legend, render

DASHBOARD = Path(__file__).resolve().parents[3] / "manifests/monitoring/sandman-dashboard.json"


def test_legend_format_and_units() -> None:
    assert legend("p99 {{endpoint}}", {"endpoint": "mutate"}) == "p99 mutate"
    assert legend("", {"b": "2", "a": "1"}) == '{a="1", b="2"}'
    assert fmt_value(0.0042, "s") == "4.2 ms"
    assert fmt_value(0.25, "percentunit") == "25%"
    assert fmt_value(3.0, "short") == "3"


def test_the_dashboard_renders_on_its_grid_with_data_where_given(tmp_path: Path) -> None:
    d = json.loads(DASHBOARD.read_text())
    graphs = [p for p in d["panels"] if p["type"] == "timeseries"]
    stat = next(p for p in d["panels"] if p["type"] == "stat")
    t0 = 1_700_000_000.0
    pts = [(t0 + i, float(i % 7)) for i in range(60)]
    results = {graphs[0]["id"]: [("a", pts), ("b", pts[::2])], stat["id"]: [("days", pts)]}
    out = render(d, results, tmp_path / "d.png", span=(t0, t0 + 60), subtitle="test")
    img = mpimg.imread(out)
    h, w = img.shape[:2]
    assert w == 24 * 80  # 24 grid columns of 80 px
    assert h > 1000  # every row of panels, stacked
    # The first graph's plot area has line pixels (green/yellow), the empty
    # graphs' areas only the panel background and "No data".
    g = graphs[0]["gridPos"]
    first = img[int(h * 0.06) : int(h * 0.2), 0 : int(g["w"] * 80)]
    assert (np.abs(first[..., 1] - first[..., 2]) > 0.2).sum() > 200  # colored lines
    assert img.std() > 0.02  # not a blank canvas
