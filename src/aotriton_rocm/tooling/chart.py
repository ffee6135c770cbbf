"""Bar charts as PNG files, with the standard library only (zlib + struct).

Build-time only. Used for the per-arch build report (``build-report.png``)
and ``aotriton-rocm validate --chart``. No plotting package is needed: the
build hosts and CI have none, and matplotlib with its dependencies is far
larger than the one chart it would draw. Text is drawn with a built-in 5x7
pixel font (upper case, digits and a little punctuation), so the output is
the same bytes on every machine.
"""
from __future__ import annotations

import math
import struct
import zlib
from typing import List, Optional, Sequence, Tuple

__all__ = ["Canvas", "Panel", "bar_chart_png", "png_bytes"]

Color = Tuple[int, int, int]
WHITE: Color = (255, 255, 255)
BLACK: Color = (20, 20, 20)
GREY: Color = (150, 150, 150)
LIGHT: Color = (225, 225, 225)
BLUE: Color = (52, 101, 164)
ORANGE: Color = (230, 140, 30)
RED: Color = (200, 40, 40)

# 5x7 glyphs, one string per glyph: 7 rows of 5 pixels, rows separated by "|".
_GLYPHS = {
    "0": ".###.|#...#|#..##|#.#.#|##..#|#...#|.###.",
    "1": "..#..|.##..|..#..|..#..|..#..|..#..|.###.",
    "2": ".###.|#...#|....#|...#.|..#..|.#...|#####",
    "3": "####.|....#|....#|.###.|....#|....#|####.",
    "4": "...#.|..##.|.#.#.|#..#.|#####|...#.|...#.",
    "5": "#####|#....|####.|....#|....#|#...#|.###.",
    "6": ".###.|#....|#....|####.|#...#|#...#|.###.",
    "7": "#####|....#|...#.|..#..|.#...|.#...|.#...",
    "8": ".###.|#...#|#...#|.###.|#...#|#...#|.###.",
    "9": ".###.|#...#|#...#|.####|....#|....#|.###.",
    "A": ".###.|#...#|#...#|#####|#...#|#...#|#...#",
    "B": "####.|#...#|#...#|####.|#...#|#...#|####.",
    "C": ".###.|#...#|#....|#....|#....|#...#|.###.",
    "D": "####.|#...#|#...#|#...#|#...#|#...#|####.",
    "E": "#####|#....|#....|####.|#....|#....|#####",
    "F": "#####|#....|#....|####.|#....|#....|#....",
    "G": ".###.|#...#|#....|#.###|#...#|#...#|.####",
    "H": "#...#|#...#|#...#|#####|#...#|#...#|#...#",
    "I": ".###.|..#..|..#..|..#..|..#..|..#..|.###.",
    "J": "..###|...#.|...#.|...#.|...#.|#..#.|.##..",
    "K": "#...#|#..#.|#.#..|##...|#.#..|#..#.|#...#",
    "L": "#....|#....|#....|#....|#....|#....|#####",
    "M": "#...#|##.##|#.#.#|#.#.#|#...#|#...#|#...#",
    "N": "#...#|#...#|##..#|#.#.#|#..##|#...#|#...#",
    "O": ".###.|#...#|#...#|#...#|#...#|#...#|.###.",
    "P": "####.|#...#|#...#|####.|#....|#....|#....",
    "Q": ".###.|#...#|#...#|#...#|#.#.#|#..#.|.##.#",
    "R": "####.|#...#|#...#|####.|#.#..|#..#.|#...#",
    "S": ".####|#....|#....|.###.|....#|....#|####.",
    "T": "#####|..#..|..#..|..#..|..#..|..#..|..#..",
    "U": "#...#|#...#|#...#|#...#|#...#|#...#|.###.",
    "V": "#...#|#...#|#...#|#...#|#...#|.#.#.|..#..",
    "W": "#...#|#...#|#...#|#.#.#|#.#.#|#.#.#|.#.#.",
    "X": "#...#|#...#|.#.#.|..#..|.#.#.|#...#|#...#",
    "Y": "#...#|#...#|.#.#.|..#..|..#..|..#..|..#..",
    "Z": "#####|....#|...#.|..#..|.#...|#....|#####",
    " ": ".....|.....|.....|.....|.....|.....|.....",
    ".": ".....|.....|.....|.....|.....|.##..|.##..",
    ",": ".....|.....|.....|.....|.##..|..#..|.#...",
    ":": ".....|.##..|.##..|.....|.##..|.##..|.....",
    ";": ".....|.##..|.##..|.....|.##..|..#..|.#...",
    "/": "....#|....#|...#.|..#..|.#...|#....|#....",
    "-": ".....|.....|.....|#####|.....|.....|.....",
    "_": ".....|.....|.....|.....|.....|.....|#####",
    "(": "...#.|..#..|.#...|.#...|.#...|..#..|...#.",
    ")": ".#...|..#..|...#.|...#.|...#.|..#..|.#...",
    "%": "##..#|##..#|...#.|..#..|.#...|#..##|#..##",
    "~": ".....|.....|.#...|#.#.#|...#.|.....|.....",
    "=": ".....|.....|#####|.....|#####|.....|.....",
    "+": ".....|..#..|..#..|#####|..#..|..#..|.....",
    "*": ".....|#.#.#|.###.|#####|.###.|#.#.#|.....",
    "'": "..#..|..#..|.#...|.....|.....|.....|.....",
    "?": ".###.|#...#|....#|...#.|..#..|.....|..#..",
}
_FONT = {ch: [[c == "#" for c in row] for row in g.split("|")] for ch, g in _GLYPHS.items()}
GLYPH_W, GLYPH_H = 6, 8  # with one pixel of spacing


class Canvas:
    """An RGB raster with rectangles and text."""

    def __init__(self, width: int, height: int, bg: Color = WHITE):
        self.w, self.h = int(width), int(height)
        self.rows = [bytearray(bytes(bg) * self.w) for _ in range(self.h)]

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Fill [x0, x1) x [y0, y1), clipped to the canvas."""
        x0, x1 = max(0, int(x0)), min(self.w, int(x1))
        y0, y1 = max(0, int(y0)), min(self.h, int(y1))
        if x0 >= x1 or y0 >= y1:
            return
        run = bytes(color) * (x1 - x0)
        for y in range(y0, y1):
            self.rows[y][3 * x0:3 * x1] = run

    def text(self, x: int, y: int, s: str, color: Color = BLACK, scale: int = 2) -> int:
        """Draw ``s`` (upper-cased) with its top-left at (x, y); returns the width drawn."""
        cx = int(x)
        for ch in str(s).upper():
            g = _FONT.get(ch, _FONT["?"])
            for gy, row in enumerate(g):
                for gx, on in enumerate(row):
                    if on:
                        self.rect(cx + gx * scale, y + gy * scale, cx + (gx + 1) * scale,
                                  y + (gy + 1) * scale, color)
            cx += GLYPH_W * scale
        return cx - int(x)

    @staticmethod
    def text_width(s: str, scale: int = 2) -> int:
        return len(str(s)) * GLYPH_W * scale

    def png(self) -> bytes:
        return png_bytes(self.w, self.h, self.rows)


def png_bytes(width: int, height: int, rows: Sequence[bytes]) -> bytes:
    """An 8-bit RGB PNG of ``rows`` (each 3 * width bytes)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    raw = b"".join(b"\x00" + bytes(r) for r in rows)  # filter type 0 (none) per row
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


class Panel:
    """One bar panel: a title, one value per category (None: no bar, "-"),
    optional per-bar colors and a value formatter."""

    def __init__(self, title: str, values: Sequence[Optional[float]],
                 colors: Optional[Sequence[Color]] = None, fmt=None, note: str = ""):
        self.title = title
        self.values = list(values)
        self.colors = list(colors) if colors else [BLUE] * len(self.values)
        self.fmt = fmt or _fmt
        self.note = note


def _fmt(v: float) -> str:
    if v >= 10000:
        return f"{v / 1000:.0f}K"
    if v == int(v):
        return str(int(v))
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


def bar_chart_png(title: str, categories: Sequence[str], panels: Sequence[Panel],
                  notes: Sequence[str] = (), legend: Sequence[Tuple[Color, str]] = ()) -> bytes:
    """Panels stacked vertically, one bar per category in each; returns PNG bytes."""
    s = 2
    slot = max(Canvas.text_width(c, s) for c in list(categories) + ["99999.9"]) + 20
    left, right = 20, 20
    width = max(left + slot * len(categories) + right,
                max(Canvas.text_width(t, s) for t in
                    [title, *notes, *(f"{p.title}  {p.note}" for p in panels)]) + 40)
    header = 20 + (1 + len(notes)) * 22 + (22 if legend else 0)
    panel_h, bar_h = 210, 120
    height = header + panel_h * len(panels) + 10
    cv = Canvas(width, height)
    cv.text(left, 14, title, BLACK, s)
    y = 36
    for n in notes:
        cv.text(left, y, n, GREY, s)
        y += 22
    if legend:
        x = left
        for color, label in legend:
            cv.rect(x, y, x + 14, y + 14, color)
            x += 20 + cv.text(x + 20, y, label, BLACK, s) + 20
        y += 22
    top = header
    for p in panels:
        cv.text(left, top + 6, p.title + (f"  {p.note}" if p.note else ""), BLACK, s)
        base = top + 54 + bar_h  # bar baseline (room for the tallest bar's label)
        vals = [v for v in p.values if v is not None and not (isinstance(v, float) and math.isnan(v))]
        vmax = max(vals) if vals and max(vals) > 0 else 1.0
        cv.rect(left, base, left + slot * len(categories), base + 2, GREY)
        for i, (cat, v) in enumerate(zip(categories, p.values)):
            x0 = left + i * slot
            if v is None:
                label = "-"
            else:
                hgt = int(round(bar_h * max(0.0, float(v)) / vmax))
                if v > 0:
                    hgt = max(hgt, 2)
                cv.rect(x0 + 10, base - hgt, x0 + slot - 10, base, p.colors[i])
                label = p.fmt(float(v))
                hgt_label = base - hgt - 18
                cv.text(x0 + (slot - cv.text_width(label, s)) // 2, hgt_label, label, BLACK, s)
                label = None
            if label:
                cv.text(x0 + (slot - cv.text_width(label, s)) // 2, base - 18, label, GREY, s)
            cv.text(x0 + (slot - cv.text_width(cat, s)) // 2, base + 8, cat, BLACK, s)
        top += panel_h
    return cv.png()
