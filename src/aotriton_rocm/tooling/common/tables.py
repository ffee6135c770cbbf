"""Text tables for the build tooling's reports (build, validate), laid out by rich.

One look everywhere: a header row, columns two spaces apart, text columns
left-aligned and numbers right-aligned, no borders and no colour, so the
table reads the same on a terminal, in a CI log and in a test, and scripts
can split it on whitespace.
"""
from __future__ import annotations

import io
from typing import Collection, Sequence

__all__ = ["render_table"]

# Wide enough never to wrap a row (rich wraps at the console width).
_NO_WRAP_WIDTH = 100_000


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, left: Collection[int] = (0,)) -> str:
    """The table as text: the columns whose index is in ``left`` (negative
    indices count from the end) left-aligned, the others right-aligned;
    trailing spaces dropped."""
    from rich.console import Console
    from rich.table import Table

    n = len(header)
    left_cols = {i % n for i in left}
    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1), header_style="", show_header=True)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i in left_cols else "right", no_wrap=True)
    for row in rows:
        table.add_row(*[str(c) for c in row])
    buf = io.StringIO()
    console = Console(file=buf, width=_NO_WRAP_WIDTH, color_system=None, force_terminal=False,
                      highlight=False, markup=False, emoji=False)
    console.print(table)
    return "\n".join(line.rstrip() for line in buf.getvalue().rstrip("\n").split("\n"))
