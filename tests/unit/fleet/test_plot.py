from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from sandman.fleet.plot import (
    BUSY,
    IDLE,
    QUARANTINED,
    WARMING,
    Raster,
    encode_png,
    timeline_png,
    timeline_raster,
)
from sandman.fleet.records import Attempt, Outcome, RolloutRecord, RunData, SandboxSpan, Source


def read_png(data: bytes) -> tuple[int, int, bytes]:
    """Check the structure and every CRC; return width, height and the inflated IDAT."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        tag, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(tag + body) & 0xFFFFFFFF
        chunks.append((tag, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    width, height, depth, colour, *_ = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour) == (8, 2)
    raw = zlib.decompress(b"".join(body for tag, body in chunks if tag == b"IDAT"))
    assert len(raw) == height * (1 + 3 * width)
    return width, height, raw


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


def test_encode_png_round_trips_pixels() -> None:
    img = Raster.blank(3, 2)
    img.fill(1, 0, 2, 1, (1, 2, 3))
    width, height, raw = read_png(img.png())
    assert (width, height) == (3, 2)
    assert raw[0] == 0  # filter byte
    assert raw[1 + 3 : 1 + 6] == bytes([1, 2, 3])
    with pytest.raises(ValueError):
        encode_png(2, 2, b"\x00" * 3)


def test_fill_and_text_clip_at_edges() -> None:
    img = Raster.blank(10, 10)
    img.fill(-5, -5, 50, 2, (9, 9, 9))
    img.text(8, 8, "W?~")  # partly off the image; unknown glyphs fall back to "?"
    assert len(img.pixels) == 300
    assert img.pixels[:3] == bytes([9, 9, 9])


def test_timeline_png_is_valid_with_expected_size(tmp_path: Path) -> None:
    runs = [run("pool", 20, reuse=True), run("on-demand", 5)]
    path = timeline_png(runs, tmp_path / "plots" / "timeline.png")
    width, height, _ = read_png(path.read_bytes())
    assert width == 1200
    img = timeline_raster(runs)
    assert (img.width, img.height) == (width, height)
    pixels = bytes(img.pixels)
    for colour in (WARMING, IDLE, BUSY, QUARANTINED):
        assert bytes(colour) in pixels


def test_rows_are_capped_by_sampling() -> None:
    small = timeline_raster(run("pool", 50), max_rows=100)
    big = timeline_raster(run("pool", 5000), max_rows=100)
    assert big.height < 200 + small.height
    assert timeline_raster(run("pool", 5000), width=600, max_rows=100).width == 600


def test_empty_runs_do_not_crash(tmp_path: Path) -> None:
    empty = RunData("on-demand", False, 0, 0, 1)
    width, height, _ = read_png(timeline_png(empty, tmp_path / "empty.png").read_bytes())
    assert width == 1200 and height > 0
    read_png(timeline_png([], tmp_path / "none.png").read_bytes())
    read_png(timeline_png([empty, run("pool", 3)], tmp_path / "mixed.png").read_bytes())
