"""Per-arch bar charts as PNG files, drawn with matplotlib (Agg, no display).

Build-time only (the ``build`` extra). Used for the build report
(``OUT/build-report.png``) and ``aotriton-rocm validate --chart``: one small
bar plot per figure of merit, the archs along the x axis, each plot with its
title, a y-axis label with units and the value on every bar; a legend says
what the bar colours mean and a subtitle names the toolchain.

The same input gives the same bytes on one installation: matplotlib's own
style (not the user's matplotlibrc), its bundled DejaVu Sans font, and no
``Software`` stamp in the PNG. Across matplotlib or FreeType versions the
pixels may differ; no reproducibility check compares the chart (it is not
shipped, and build-report.json carries the same numbers).
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Tuple

__all__ = ["BLUE", "ORANGE", "RED", "GREY", "Panel", "bar_chart_figure", "bar_chart_png"]

# Colour-blind-safe (Okabe-Ito) blue / orange / vermillion.
BLUE = "#0072B2"
ORANGE = "#E69F00"
RED = "#D55E00"
GREY = "#7F7F7F"

PANEL_COLUMNS = 2
PANEL_INCHES = (5.2, 3.2)  # width, height of one plot
DPI = 100


def _fmt(v: float) -> str:
    if v >= 10000:
        return f"{v / 1000:.0f}k"
    if v == int(v) or v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}"


@dataclass
class Panel:
    """One bar plot: ``title``, ``ylabel`` (with units), one value per arch
    (None: nothing to show, drawn as "n/a"), optional per-bar colours, a value
    formatter for the bar labels, a ``note`` under the title; ``counts``: whole
    numbers only on the y axis."""

    title: str
    values: Sequence[Optional[float]]
    colors: Optional[Sequence[str]] = None
    ylabel: str = ""
    note: str = ""
    counts: bool = False
    fmt: Callable[[float], str] = field(default=_fmt)


def _missing(v: Optional[float]) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _draw_panel(ax, categories: Sequence[str], panel: Panel) -> None:
    from matplotlib.ticker import MaxNLocator

    xs = list(range(len(categories)))
    heights = [0.0 if _missing(v) else float(v) for v in panel.values]
    colors = list(panel.colors) if panel.colors else [BLUE] * len(xs)
    bars = ax.bar(xs, heights, width=0.6, color=colors, edgecolor="none", zorder=2)
    labels = ["n/a" if _missing(v) else panel.fmt(float(v)) for v in panel.values]
    ax.bar_label(bars, labels=labels, padding=2, fontsize=9,
                 color="#222222")
    top = max(heights, default=0.0)
    ax.set_ylim(0, top * 1.18 if top > 0 else 1.0)
    ax.set_xticks(xs, list(categories))
    ax.set_title(panel.title + (f"\n{panel.note}" if panel.note else ""), fontsize=11, loc="left")
    ax.set_ylabel(panel.ylabel)
    ax.set_xlabel("arch")
    ax.grid(axis="y", color="#dddddd", linewidth=0.8, zorder=0)
    ax.spines[["top", "right"]].set_visible(False)
    if panel.counts:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.yaxis.set_major_formatter(lambda v, _pos: _fmt(v) if v >= 0 else "")


def bar_chart_figure(title: str, categories: Sequence[str], panels: Sequence[Panel],
                     notes: Sequence[str] = (), legend: Sequence[Tuple[str, str]] = ()):
    """A matplotlib Figure (Agg canvas): one bar plot per panel, two per row,
    ``notes`` as a subtitle, ``legend`` as (colour, label) pairs."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = max(1, math.ceil(len(panels) / PANEL_COLUMNS))
    cols = PANEL_COLUMNS if len(panels) > 1 else 1
    fig = Figure(figsize=(PANEL_INCHES[0] * cols, PANEL_INCHES[1] * rows + 1.1), dpi=DPI,
                 layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, panel in zip(axes, panels):
        _draw_panel(ax, categories, panel)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    heading = title + ("\n" + "; ".join(notes) if notes else "")
    fig.suptitle(heading, fontsize=13, x=0.01, ha="left")
    if legend:
        fig.legend(handles=[Patch(color=c, label=lbl) for c, lbl in legend], loc="outside lower center",
                   ncols=len(legend), frameon=False)
    return fig


def bar_chart_png(title: str, categories: Sequence[str], panels: Sequence[Panel],
                  notes: Sequence[str] = (), legend: Sequence[Tuple[str, str]] = ()) -> bytes:
    """:func:`bar_chart_figure` as PNG bytes (the same bytes for the same input
    on one installation)."""
    import matplotlib
    import matplotlib.style

    with matplotlib.style.context("default"):
        fig = bar_chart_figure(title, categories, panels, notes, legend)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()
