"""Chart of a bench_attention.py JSON report: TFLOP/s against sequence length,
one panel per (pass, mask) row and head dim column, one line per peer; one
PNG per dtype (the dtype goes into the file name).

    python benchmarks/plot_attention.py bench.json bench.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PEER_STYLE = {  # our kernels stand out; torch's backends in muted colours
    "aotriton-rocm": {"color": "#c0392b", "linewidth": 2.4, "marker": "o"},
    "FLASH": {"color": "#2c7fb8", "linewidth": 1.4, "marker": "s"},
    "CUDNN": {"color": "#31a354", "linewidth": 1.4, "marker": "^"},
    "EFFICIENT": {"color": "#888888", "linewidth": 1.2, "marker": "v"},
    "triton JIT": {"color": "#e6a23c", "linewidth": 1.2, "marker": "d", "linestyle": "--"},
}
PANEL_ROWS = (("fwd", False), ("fwd", True), ("bwd", False), ("bwd", True))


def _series(rows, dtype, head_dim, pass_name, causal):
    """{peer: [(S, TFLOP/s)]} over the standard shapes of one panel."""
    series: dict[str, list] = {}
    for row in rows:
        s = row["shape"]
        if (s["label"], s["dtype"], s["head_dim"], s["causal"]) != \
                ("standard", dtype, head_dim, causal):
            continue
        for peer, tflops in row["tflops"].get(pass_name, {}).items():
            series.setdefault(peer, []).append((s["seqlen_q"], tflops))
    return {peer: sorted(points) for peer, points in series.items()}


def _seqlen_label(x, _pos) -> str:
    return f"{int(x) // 1024}k" if x >= 1024 else f"{int(x)}"


def plot(report: dict, out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = report["rows"]
    written = []
    dtypes = sorted({r["shape"]["dtype"] for r in rows if r["shape"]["label"] == "standard"})
    head_dims = sorted({r["shape"]["head_dim"] for r in rows if r["shape"]["label"] == "standard"})
    for dtype in dtypes:
        fig, axes = plt.subplots(len(PANEL_ROWS), len(head_dims), squeeze=False,
                                 figsize=(4.2 * len(head_dims), 3.0 * len(PANEL_ROWS)),
                                 sharex=True, constrained_layout=True)
        for r, (pass_name, causal) in enumerate(PANEL_ROWS):
            for c, d in enumerate(head_dims):
                ax = axes[r][c]
                for peer, points in _series(rows, dtype, d, pass_name, causal).items():
                    xs, ys = zip(*points)
                    ax.plot(xs, ys, label=peer, markersize=4, **PEER_STYLE.get(peer, {}))
                ax.set_xscale("log", base=2)
                ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_seqlen_label))
                ax.set_ylim(bottom=0)
                ax.grid(True, which="major", alpha=0.3)
                ax.set_title(f"{pass_name}, {'causal' if causal else 'full'}, head dim {d}",
                             fontsize=10)
                if c == 0:
                    ax.set_ylabel("TFLOP/s")
                if r == len(PANEL_ROWS) - 1:
                    ax.set_xlabel("sequence length (B*S = 16k tokens, H*D = 2048)")
        handles = {}
        for ax in axes.flat:
            for h, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, h)
        fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center",
                   ncol=len(handles), frameon=False)
        meta = report.get("meta", {})
        fig.suptitle(f"attention {dtype}: {meta.get('gpu', '?')}, torch {meta.get('torch', '?')}, "
                     f"aotriton-rocm {meta.get('aotriton_rocm', '?')}", fontsize=12)
        path = out if len(dtypes) == 1 else out.with_name(f"{out.stem}-{dtype}{out.suffix}")
        fig.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("report", type=Path, help="bench_attention.py --json output")
    parser.add_argument("out", type=Path, help="PNG path (one per dtype: -fp16/-bf16 added)")
    args = parser.parse_args(argv)
    for path in plot(json.loads(args.report.read_text()), args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
