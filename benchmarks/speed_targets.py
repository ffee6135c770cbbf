"""Checks a bench_attention.py JSON report against the H100 speed targets.

    python benchmarks/speed_targets.py REPORT.json [REPORT.json ...]

The targets, on FlashAttention's standard shapes (fp16 and bf16, causal and
not, head dims 64/128/256, S = 512..16k):

* forward and backward at least 1.0x torch's FLASH backend at every S;
* backward at least 1.2x FLASH at S >= 2k;
* forward at least 0.85x CUDNN at head dims 64 and 128, S >= 2k.

Prints one markdown table per dtype (ours / FLASH and ours / CUDNN per cell,
a cell below its target marked with "!") and the count of checks met, then
lists the checks below target. Exits 1 when any check is below target or a
cell has no figure (a fallback or an error counts as below). Needs only the
standard library, so it runs where the report was copied to.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

OURS = "aotriton-rocm"
LONG = 2048  # "S >= 2k"


@dataclass(frozen=True)
class Check:
    pass_name: str
    peer: str
    target: float


def checks_for(head_dim: int, seqlen: int) -> list[Check]:
    """The targets that apply to a standard cell."""
    checks = [Check("fwd", "FLASH", 1.0), Check("bwd", "FLASH", 1.2 if seqlen >= LONG else 1.0)]
    if head_dim in (64, 128) and seqlen >= LONG:
        checks.append(Check("fwd", "CUDNN", 0.85))
    return checks


def ratio(row: dict, pass_name: str, peer: str) -> float | None:
    """Ours over PEER's TFLOP/s in ROW's pass; None where either is missing."""
    tflops = row["tflops"].get(pass_name, {})
    ours, theirs = tflops.get(OURS), tflops.get(peer)
    if not isinstance(ours, (int, float)) or not isinstance(theirs, (int, float)) or theirs <= 0:
        return None
    return ours / theirs


def evaluate(rows: list[dict]) -> list[tuple[dict, Check, float | None]]:
    """(shape, check, ratio) for every check of every standard row."""
    results = []
    for row in rows:
        shape = row["shape"]
        if shape["label"] != "standard":
            continue
        for check in checks_for(shape["head_dim"], shape["seqlen_q"]):
            results.append((shape, check, ratio(row, check.pass_name, check.peer)))
    return results


def met(value: float | None, check: Check) -> bool:
    return value is not None and value >= check.target


def markdown(results) -> str:
    """One table per dtype: a row per (head dim, causal, S), a column per check."""
    cells: dict = {}
    for s, check, value in results:
        row = (s["dtype"], s["head_dim"], s["causal"], s["seqlen_q"])
        text = "-" if value is None else f"{value:.2f}" + ("" if met(value, check) else "!")
        cells.setdefault(row, {})[(check.pass_name, check.peer)] = text
    lines = []
    for dtype in sorted({row[0] for row in cells}):
        lines += [f"### {dtype}", "",
                  "| head dim | causal | S | fwd / FLASH | fwd / CUDNN | bwd / FLASH |", "|---|---|---|---|---|---|"]
        for row in sorted(r for r in cells if r[0] == dtype):
            c = cells[row]
            lines.append(f"| {row[1]} | {'yes' if row[2] else 'no'} | {row[3]} | {c.get(('fwd', 'FLASH'), '')} | "
                         f"{c.get(('fwd', 'CUDNN'), '')} | {c.get(('bwd', 'FLASH'), '')} |")
        lines.append("")
    return "\n".join(lines)


def load_rows(paths) -> list[dict]:
    rows = []
    for path in paths:
        rows += json.loads(Path(path).read_text())["rows"]
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", help="bench_attention.py --json output")
    args = parser.parse_args(argv)
    results = evaluate(load_rows(args.reports))
    if not results:
        print("no standard-shape rows in the report(s): run bench_attention.py without --quick filters")
        return 1
    print(markdown(results))
    below = [(s, c, v) for s, c, v in results if not met(v, c)]
    print(f"{len(results) - len(below)} of {len(results)} checks met")
    for s, c, v in below:
        figure = "no figure" if v is None else f"{v:.4f}"
        print(f"  below: {s['dtype']} head dim {s['head_dim']} S={s['seqlen_q']} "
              f"{'causal' if s['causal'] else 'full'} {c.pass_name} / {c.peer} {figure} < {c.target}")
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
