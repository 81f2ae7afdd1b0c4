"""The PNG charts, drawn without a plotting library: one bar panel per chosen (scenario, metric) with a bar per mode
(:func:`draw`), or panels of lines, one per series, over a shared x axis (:func:`draw_series`).

The image is an RGB pixel grid written as a PNG with zlib and struct (one IDAT chunk, filter 0 per row). Labels
use a 3×5 pixel font scaled up, upper case only; each bar is labelled with its mode and its median.
"""

# ruff: noqa: RUF001, RUF002, RUF003 - the tables use × and en dashes on purpose

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.mesh.results import Row
from bench.report import number

_FONT = {  # 3 columns × 5 rows, rows top to bottom, bit 2 = left column
    "A": "25755", "B": "65656", "C": "74447", "D": "65556", "E": "74647", "F": "74644", "G": "74557",
    "H": "55755", "I": "72227", "J": "11157", "K": "55655", "L": "44447", "M": "57755", "N": "65555",
    "O": "75557", "P": "75744", "Q": "75571", "R": "75765", "S": "74717", "T": "72222", "U": "55557",
    "V": "55552", "W": "55775", "X": "55255", "Y": "55222", "Z": "71247", "0": "75557", "1": "26227",
    "2": "71747", "3": "71717", "4": "55711", "5": "74717", "6": "74757", "7": "71111", "8": "75757",
    "9": "75717", ".": "00002", ",": "00024", "-": "00700", "/": "11244", " ": "00000", "(": "24442",
    ")": "42224", ":": "02020", "%": "41241", "µ": "55564", "×": "05250",
}  # fmt: skip
_COLOURS = [(120, 120, 120), (70, 110, 200), (60, 170, 170), (220, 120, 40), (240, 180, 60)]
_SCALE = 2
_WIDTH, _PANEL_H = 720, 260


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def rect(self, x: int, y: int, w: int, h: int, colour: tuple[int, int, int]) -> None:
        for row in range(max(0, y), min(self.height, y + h)):
            start = (row * self.width + max(0, x)) * 3
            end = (row * self.width + min(self.width, x + w)) * 3
            if end > start:
                self.pixels[start:end] = bytes(colour) * ((end - start) // 3)

    def text(self, x: int, y: int, text: str, colour: tuple[int, int, int] = (0, 0, 0)) -> None:
        for char in text:
            glyph = _FONT.get(char) or _FONT.get(char.upper(), "00000")  # µ before upper() turns it into Greek Μ
            for r, bits in enumerate(glyph):
                for c in range(3):
                    if int(bits) & (4 >> c):
                        self.rect(x + c * _SCALE, y + r * _SCALE, _SCALE, _SCALE, colour)
            x += 4 * _SCALE

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[row * self.width * 3 : (row + 1) * self.width * 3])
            for row in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
        )


def draw(rows: Sequence[Row], panels: Sequence[tuple[str, str]], path: Path) -> Path:
    """A panel per (scenario, metric) in ``panels`` that has rows; written to ``path``."""
    chosen = [[r for r in rows if (r.scenario, r.metric) == p] for p in panels]
    chosen = [c for c in chosen if c]
    canvas = _Canvas(_WIDTH, max(1, len(chosen)) * _PANEL_H)
    for index, group in enumerate(chosen):
        top = index * _PANEL_H
        title = f"{group[0].scenario}: {group[0].metric} ({group[0].unit})"
        canvas.text(10, top + 8, title)
        peak = max(r.max for r in group) or 1.0
        base, height = top + _PANEL_H - 40, _PANEL_H - 80
        slot = (_WIDTH - 20) // len(group)
        for i, r in enumerate(group):
            x = 10 + i * slot
            bar = int(height * r.value / peak)
            canvas.rect(x + 10, base - bar, slot - 20, bar, _COLOURS[i % len(_COLOURS)])
            low, high = int(height * r.min / peak), int(height * r.max / peak)
            canvas.rect(x + slot // 2 - 1, base - high, 2, max(1, high - low), (0, 0, 0))
            canvas.text(x + 10, base - bar - 14, number(r.value))
            canvas.text(x + 10, base + 8, r.mode)
        canvas.rect(10, base, _WIDTH - 20, 1, (0, 0, 0))
    path.write_bytes(canvas.png())
    return path


def draw_series(panels: Sequence[tuple[str, Mapping[str, Sequence[tuple[float, float]]]]], path: Path) -> Path:
    """A panel per (title, series name → points) in ``panels``: a line per series, the y axis from 0 to the
    panel's peak, its peak and the x range written at the axes; written to ``path``."""
    canvas = _Canvas(_WIDTH, max(1, len(panels)) * _PANEL_H)
    left, right = 60, _WIDTH - 20
    for index, (title, series) in enumerate(panels):
        top = index * _PANEL_H
        canvas.text(10, top + 8, title)
        points = [p for line in series.values() for p in line]
        if not points:
            continue
        x_low, x_high = min(p[0] for p in points), max(p[0] for p in points)
        peak = max(p[1] for p in points) or 1.0
        base, height = top + _PANEL_H - 40, _PANEL_H - 80

        frame = (x_low, (x_high - x_low) or 1.0, base, height, peak)
        for i, (name, line) in enumerate(sorted(series.items())):
            colour = _COLOURS[(i + 1) % len(_COLOURS)]
            for a, b in itertools.pairwise(line):
                (x0, y0), (x1, y1) = _at(a, frame, left, right), _at(b, frame, left, right)
                steps = max(abs(x1 - x0), abs(y1 - y0), 1)
                for step in range(steps + 1):
                    canvas.rect(x0 + (x1 - x0) * step // steps, y0 + (y1 - y0) * step // steps, 2, 2, colour)
            canvas.text(left + 10 + i * 200, top + 28, name, colour)
        canvas.rect(left, base, right - left, 1, (0, 0, 0))
        canvas.rect(left, base - height, 1, height, (0, 0, 0))
        canvas.text(4, base - height, number(peak))
        canvas.text(4, base - 4, "0")
        canvas.text(left, base + 8, number(x_low))
        canvas.text(right - 8 * len(number(x_high)) * _SCALE // 2, base + 8, number(x_high))
    path.write_bytes(canvas.png())
    return path


def _at(
    point: tuple[float, float], frame: tuple[float, float, int, int, float], left: int, right: int
) -> tuple[int, int]:
    """A point's pixel in a panel: ``frame`` is (x origin, x span, the base line's y, the plot's height, the peak)."""
    x_low, span, base, height, peak = frame
    return left + int((right - left) * (point[0] - x_low) / span), base - int(height * point[1] / peak)
