"""Progress of one build stage (e.g. compiling the cache misses), on stderr.

On a terminal (not under CI, not ``TERM=dumb``): a live rich progress bar (done/total, percent, rate, elapsed,
ETA and the item just finished); messages print above it.

Anywhere else (CI logs, ``scripts/main.sh > log``): quiet plain lines, never
one per item: one when the stage starts (what it has to do), one each time
another ``step_percent`` of the work is done but at most one every
``min_interval`` seconds, and one when it ends (counts and seconds). A stage
of any length writes at most ``100 / step_percent + 2`` lines.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable, Optional, TextIO

__all__ = ["Progress", "format_seconds"]


def format_seconds(s: float) -> str:
    if s != s or s == float("inf"):
        return "?"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _is_terminal(stream: TextIO) -> bool:
    """A person watching: a TTY, not a dumb terminal, not CI (CI runners may
    give jobs a pseudo-terminal, whose log would keep every redraw)."""
    if os.environ.get("CI") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class _LiveBar:
    """The terminal view: a rich Progress with one task."""

    def __init__(self, stream: TextIO, desc: str, total: int):
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, TaskProgressColumn,
                                   TextColumn, TimeElapsedColumn, TimeRemainingColumn)

        console = Console(file=stream, force_terminal=True, highlight=False)
        self.bar = RichProgress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
            TextColumn("{task.fields[rate]}"), TextColumn("elapsed"), TimeElapsedColumn(),
            TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[label]}", markup=False),
            console=console, transient=False)
        self.task = self.bar.add_task(desc, total=total, rate="", label="")
        self.bar.start()

    def advance(self, n: int, rate: float, label: str) -> None:
        self.bar.update(self.task, advance=n, rate=f"{rate:.1f}/s", label=label)

    def print(self, msg: str) -> None:
        self.bar.console.print(msg, markup=False, highlight=False, soft_wrap=True)

    def stop(self) -> None:
        self.bar.stop()


class Progress:
    """``update()`` once per finished item, ``write()`` for messages,
    ``close()`` (or ``with``) at the end. ``enabled=False``: silent."""

    def __init__(self, total: int, desc: str = "", stream: Optional[TextIO] = None,
                 enabled: bool = True, *, step_percent: float = 10.0, min_interval: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        self.total = max(0, int(total))
        self.desc = desc or "progress"
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.step = max(1, int(self.total * step_percent / 100))
        self.min_interval = min_interval
        self.clock = clock
        self.done = 0
        self.start = clock()
        self.tty = _is_terminal(self.stream)
        self._live: Optional[_LiveBar] = None
        self._started = False
        self._closed = False
        self._next_line_at = self.step  # done count of the next plain progress line
        self._last_line = self.start

    # -- plain lines -----------------------------------------------------------
    def _emit(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def _rate(self) -> float:
        elapsed = self.clock() - self.start
        return self.done / elapsed if elapsed > 0 else 0.0

    def line(self, label: str = "") -> str:
        """The plain progress line: done/total, percent, rate, elapsed, ETA, label."""
        elapsed = self.clock() - self.start
        rate = self._rate()
        left = self.total - self.done
        eta = left / rate if rate > 0 else float("inf")
        pct = 100.0 * self.done / self.total if self.total else 100.0
        tail = f" {label}" if label else ""
        return (f"{self.desc}: {self.done}/{self.total} ({pct:.0f}%) {rate:.1f}/s "
                f"elapsed {format_seconds(elapsed)} ETA {format_seconds(eta) if left else '0:00'}{tail}")

    def _begin(self) -> None:
        if self._started or not self.enabled or self.total == 0:
            return
        self._started = True
        if self.tty:
            self._live = _LiveBar(self.stream, self.desc, self.total)
        else:
            self._emit(f"{self.desc}: started, {self.total} to do")

    # -- API -------------------------------------------------------------------
    def update(self, n: int = 1, label: str = "") -> None:
        self._begin()
        self.done = min(self.total, self.done + n)
        if not self.enabled or self.total == 0:
            return
        if self._live is not None:
            self._live.advance(n, self._rate(), label)
            return
        now = self.clock()
        if self.done >= self.total:
            return  # close() writes the summary
        if self.done >= self._next_line_at and now - self._last_line >= self.min_interval:
            self._emit(self.line(label))
            self._last_line = now
            self._next_line_at = (self.done // self.step + 1) * self.step

    def write(self, msg: str) -> None:
        """A message line (above the live bar on a terminal)."""
        if not self.enabled:
            return
        if self._live is not None:
            self._live.print(msg.rstrip("\n"))
        else:
            self._emit(msg.rstrip("\n"))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._live is not None:
            self._live.stop()
            self._live = None
        elif self.enabled and self._started:
            elapsed = self.clock() - self.start
            self._emit(f"{self.desc}: {'done' if self.done >= self.total else 'stopped at'} "
                       f"{self.done}/{self.total} in {format_seconds(elapsed)} ({self._rate():.1f}/s)")

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
