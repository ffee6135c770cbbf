"""A small progress bar on stderr (standard library only).

On a TTY: one line redrawn in place, ``[#####.....] 12/96 3.4/s ETA 0:25 label``.
Otherwise: plain lines, at most one every ``interval`` seconds (and the last one).
"""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

__all__ = ["Progress", "format_seconds"]


def format_seconds(s: float) -> str:
    if s != s or s == float("inf"):
        return "?"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class Progress:
    def __init__(self, total: int, desc: str = "", stream: Optional[TextIO] = None,
                 enabled: bool = True, width: int = 30, interval: float = 5.0):
        self.total = max(0, int(total))
        self.desc = desc
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.width = width
        self.interval = interval
        self.done = 0
        self.start = time.monotonic()
        self._last_emit: Optional[float] = None
        self._last_len = 0
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False

    def line(self, label: str = "") -> str:
        elapsed = time.monotonic() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = self.total - self.done
        eta = left / rate if rate > 0 else float("inf")
        frac = self.done / self.total if self.total else 1.0
        fill = int(frac * self.width)
        bar = "#" * fill + "." * (self.width - fill)
        head = f"{self.desc} " if self.desc else ""
        tail = f" {label}" if label else ""
        return (f"{head}[{bar}] {self.done}/{self.total} {rate:.1f}/s "
                f"elapsed {format_seconds(elapsed)} ETA {format_seconds(eta) if left else '0:00'}{tail}")

    def update(self, n: int = 1, label: str = "") -> None:
        self.done = min(self.total, self.done + n)
        if not self.enabled:
            return
        now = time.monotonic()
        last = self.done >= self.total
        if self.tty:
            text = self.line(label)
            pad = max(0, self._last_len - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._last_len = len(text)
            self.stream.flush()
        elif last or self._last_emit is None or now - self._last_emit >= self.interval:
            self.stream.write(self.line(label) + "\n")
            self.stream.flush()
            self._last_emit = now

    def write(self, msg: str) -> None:
        """A message line that does not garble the bar."""
        if not self.enabled:
            return
        if self.tty and self._last_len:
            self.stream.write("\r" + " " * self._last_len + "\r")
            self._last_len = 0
        self.stream.write(msg.rstrip("\n") + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self._last_len:
            self.stream.write("\n")
            self.stream.flush()
            self._last_len = 0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
