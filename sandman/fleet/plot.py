"""A PNG timeline of fleet runs: one row per sandbox, one panel per run.

Drawn on a tiny RGB raster and encoded by hand (zlib + struct) so plotting
adds no dependency to a service that otherwise needs none of matplotlib's.
All panels share one time axis, so strategies compare by eye.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandman.fleet.records import RunData, SandboxSpan, Source
from sandman.fleet.report import span_end, wall_time_s

RGB = tuple[int, int, int]

BACKGROUND: RGB = (255, 255, 255)
TEXT: RGB = (30, 30, 30)
GRID: RGB = (228, 228, 228)
WARMING: RGB = (245, 176, 65)
IDLE: RGB = (165, 205, 240)
BUSY: RGB = (40, 105, 185)
QUARANTINED: RGB = (215, 35, 35)
WALL: RGB = (130, 40, 170)

SCALE = 2  # font scale: 5x7 glyphs become 10x14 px
ROW_MAX_PX = 6
MARGIN = 12

# 5x7 glyphs: 7 rows as 14 hex digits, each row a 5-bit mask with the high bit on the left.
_FONT = {
    "0": "0E11131519110E", "1": "040C040404040E", "2": "0E11010204081F",
    "3": "1F02040201110E", "4": "02060A121F0202", "5": "1F101E0101110E",
    "6": "0608101E11110E", "7": "1F010204080808", "8": "0E11110E11110E",
    "9": "0E11110F01020C", "A": "0E1111111F1111", "B": "1E11111E11111E",
    "C": "0E11101010110E", "D": "1C12111111121C", "E": "1F10101E10101F",
    "F": "1F10101E101010", "G": "0E11101711110F", "H": "1111111F111111",
    "I": "0E04040404040E", "J": "0702020202120C", "K": "11121418141211",
    "L": "1010101010101F", "M": "111B1515111111", "N": "11111915131111",
    "O": "0E11111111110E", "P": "1E11111E101010", "Q": "0E11111115120D",
    "R": "1E11111E141211", "S": "0F10100E01011E", "T": "1F040404040404",
    "U": "1111111111110E", "V": "11111111110A04", "W": "1111111515150A",
    "X": "11110A040A1111", "Y": "1111110A040404", "Z": "1F01020408101F",
    " ": "00000000000000", ".": "00000000000C0C", "-": "0000001F000000",
    "+": "0004041F040400", "=": "00001F001F0000", ":": "000C0C000C0C00",
    "/": "00010204081000", "_": "0000000000001F", "(": "02040808080402",
    ")": "08040202020408", ",": "000000000C0408", "%": "18190204081303",
    "?": "0E110102040004",
}  # fmt: skip


def _glyph(ch: str) -> bytes:
    return bytes.fromhex(_FONT.get(ch.upper(), _FONT["?"]))


def text_width(text: str, scale: int = SCALE) -> int:
    return len(text) * 6 * scale


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """8-bit truecolour, no interlace, filter 0 on every scanline."""
    if width < 1 or height < 1 or len(rgb) != width * height * 3:
        raise ValueError(f"need {width}x{height}x3 bytes, got {len(rgb)}")
    stride = width * 3
    raw = b"".join(b"\x00" + rgb[y * stride : (y + 1) * stride] for y in range(height))

    def chunk(tag: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(tag + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


@dataclass
class Raster:
    width: int
    height: int
    pixels: bytearray

    @classmethod
    def blank(cls, width: int, height: int, color: RGB = BACKGROUND) -> Raster:
        return cls(width, height, bytearray(bytes(color) * (width * height)))

    def fill(self, x0: int, y0: int, x1: int, y1: int, color: RGB) -> None:
        """Fill [x0, x1) x [y0, y1), clipped to the image."""
        x0, x1 = max(0, x0), min(self.width, x1)
        y0, y1 = max(0, y0), min(self.height, y1)
        if x0 >= x1 or y0 >= y1:
            return
        run = bytes(color) * (x1 - x0)
        for y in range(y0, y1):
            i = (y * self.width + x0) * 3
            self.pixels[i : i + len(run)] = run

    def text(self, x: int, y: int, text: str, color: RGB = TEXT, scale: int = SCALE) -> None:
        for n, ch in enumerate(text):
            gx = x + n * 6 * scale
            for row, bits in enumerate(_glyph(ch)):
                for col in range(5):
                    if bits & (0x10 >> col):
                        px, py = gx + col * scale, y + row * scale
                        self.fill(px, py, px + scale, py + scale, color)

    def png(self) -> bytes:
        return encode_png(self.width, self.height, bytes(self.pixels))


def _time_extent(runs: Sequence[RunData]) -> float:
    times = [0.0]
    for run in runs:
        times += [t for t in (run.t_end, wall_time_s(run)) if t is not None]
        for s in run.spans:
            times += [t for t in (s.t_created, s.t_ready, s.t_claimed, s.t_released) if t]
        times += [r.final.t_done for r in run.records if r.final and r.final.t_done]
    return max(times) if max(times) > 0 else 1.0


def _ticks(t_max: float) -> tuple[list[float], int]:
    """Steps of 1, 2 or 5 x 10^k giving about eight ticks; also the decimals they need."""
    raw = t_max / 8
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    decimals = max(0, -math.floor(math.log10(step)))
    return [i * step for i in range(int(t_max / step + 1e-9) + 1)], decimals


def _sample(spans: Sequence[SandboxSpan], max_rows: int) -> list[SandboxSpan]:
    ordered = sorted(spans, key=lambda s: (s.t_created, s.name))
    if len(ordered) <= max_rows:
        return ordered
    # Evenly spaced rows keep the shape of the whole run; the first N would show only its start.
    return [ordered[i * len(ordered) // max_rows] for i in range(max_rows)]


def _segments(span: SandboxSpan, end: float) -> list[tuple[float, float, RGB]]:
    ready = span.t_ready
    segments = [(span.t_created, ready if ready is not None else end, WARMING)]
    if ready is None:
        return segments
    if span.source is Source.CLAIMED:
        claimed = span.t_claimed
        segments.append((ready, claimed if claimed is not None else end, IDLE))
        if claimed is not None:
            segments.append((claimed, end, BUSY))
    else:
        segments.append((ready, end, BUSY))
    return segments


def _panel_title(run: RunData, shown: int) -> str:
    wall = wall_time_s(run)
    title = f"{run.strategy} reuse={'on' if run.reuse else 'off'}  {len(run.spans)} sandboxes"
    title += f"  wall {wall:.1f}s" if wall is not None else "  wall -"
    if shown < len(run.spans):
        title += f"  (sampled {shown} of {len(run.spans)})"
    return title


def timeline_raster(
    runs: RunData | Sequence[RunData], *, width: int = 1200, max_rows: int = 400
) -> Raster:
    runs = [runs] if isinstance(runs, RunData) else list(runs)
    t_max = _time_extent(runs)
    ticks, decimals = _ticks(t_max)
    left, right = MARGIN, width - MARGIN
    line_h = 7 * SCALE + 8

    def x_of(t: float) -> int:
        return left + round(min(t, t_max) / t_max * (right - left))

    layouts = []
    for run in runs:
        rows = _sample(run.spans, max_rows)
        row_h = max(1, min(ROW_MAX_PX, max_rows // max(1, len(rows))))
        layouts.append((run, rows, row_h, max(line_h, len(rows) * row_h)))
    height = line_h + sum(line_h + bars_h + MARGIN for *_, bars_h in layouts) + line_h + 8
    img = Raster.blank(width, height)

    x = left
    for label, color in (("warming", WARMING), ("idle in pool", IDLE), ("busy", BUSY),
                         ("quarantined", QUARANTINED), ("wall", WALL)):  # fmt: skip
        img.fill(x, 6, x + 14, 6 + 14, color)
        img.text(x + 20, 6, label)
        x += 20 + text_width(label) + 24
    img.text(max(x, right - text_width("x: seconds since run start")), 6,
             "x: seconds since run start")  # fmt: skip

    y = line_h
    for run, rows, row_h, bars_h in layouts:
        img.text(left, y + 4, _panel_title(run, len(rows)))
        y += line_h
        for t in ticks:
            img.fill(x_of(t), y, x_of(t) + 1, y + bars_h, GRID)
        if not rows:
            img.text(left + 4, y + 4, "no sandboxes")
        bar_h = row_h - 1 if row_h >= 3 else row_h  # a gap between rows once they are tall enough
        for i, span in enumerate(rows):
            top, end = y + i * row_h, span_end(span, run.t_end)
            end = min(end, t_max)
            for t0, t1, color in _segments(span, end):
                if t1 > t0:
                    x0 = x_of(t0)
                    img.fill(x0, top, max(x0 + 1, x_of(t1)), top + bar_h, color)
            if span.quarantined:
                img.fill(x_of(end) - 4, top, x_of(end) + 1, top + max(bar_h, 2), QUARANTINED)
        wall = wall_time_s(run)
        if wall is not None:
            img.fill(x_of(wall) - 1, y, x_of(wall) + 1, y + bars_h, WALL)
        y += bars_h + MARGIN
        img.fill(left, y - MARGIN // 2, right, y - MARGIN // 2 + 1, GRID)

    img.fill(left, y, right + 1, y + 1, TEXT)
    for t in ticks:
        img.fill(x_of(t), y, x_of(t) + 1, y + 6, TEXT)
        label = f"{t:.{decimals}f}"
        lx = min(max(0, x_of(t) - text_width(label) // 2), width - text_width(label))
        img.text(lx, y + 8, label)
    return img


def timeline_png(
    data: RunData | Sequence[RunData], path: str | Path, *, width: int = 1200, max_rows: int = 400
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(timeline_raster(data, width=width, max_rows=max_rows).png())
    return path
