"""What a forward pays per query block besides its key blocks: ours beside
torch's FLASH and CUDNN backends.

    python benchmarks/fixed_cost.py [--dtype bf16] [--head-dim 128] [--seqlen-q 2048]
                                    [--heads 128] [--json FILE]

The query length and the number of (batch, head) pairs stay fixed while the
key length grows from one 128-key block to 32; a straight line through the
forward's time against the number of key blocks splits each call into a
part that grows with the keys (the slope) and a fixed part (the intercept).
Both are given per 128-row query block and per multiprocessor: the slope is
what one key block of one query block costs, the intercept what a query
block costs before and after its key blocks (starting a program, building
its tensor maps, the first copies, the epilogue). At short sequences, where
a query block sees few key blocks, the fixed part decides the ratios of
bench_attention.py's table. NVIDIA GPUs only (ours, FLASH and CUDNN).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_attention import (OURS, Shape, _times_ms, make_inputs, pass_fns, refusal_text, sdpa_call,  # noqa: E402
                             sdpa_on)

ROWS_PER_BLOCK = 128
KEY_BLOCKS = (1, 2, 4, 8, 16, 32)
REPS = 10


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of ys against xs."""
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError("a line needs at least two distinct x values")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def per_query_block(slope_us: float, intercept_us: float, query_blocks: int, processors: int) -> dict:
    """The fit of a whole call spread over its query blocks: each
    multiprocessor runs query_blocks / processors of them in turn."""
    waves = query_blocks / processors
    return {"per_key_block_us": slope_us / waves, "fixed_us": intercept_us / waves}


def measure(peer: str, dtype: str, head_dim: int, seqlen_q: int, heads: int) -> dict:
    times = {}
    for n in KEY_BLOCKS:
        shape = Shape("fixed-cost", 1, heads, heads, seqlen_q, n * ROWS_PER_BLOCK, head_dim, False, dtype)
        q, k, v, grad = make_inputs(shape)
        with sdpa_on(peer):
            fn = pass_fns(sdpa_call(shape), q, k, v, grad, passes=("fwd",))["fwd"]
            times[n] = statistics.median(_times_ms(fn, REPS)) * 1000.0
    slope, intercept = line_fit(list(times), list(times.values()))
    query_blocks = heads * -(-seqlen_q // ROWS_PER_BLOCK)
    fit = per_query_block(slope, intercept, query_blocks, torch.cuda.get_device_properties(0).multi_processor_count)
    return {"us_per_call": times, **fit}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bf16", choices=("fp16", "bf16"))
    parser.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256))
    parser.add_argument("--seqlen-q", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=128, help="batch x heads (one batch entry)")
    parser.add_argument("--peers", default=f"{OURS},FLASH,CUDNN")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fixed_cost.py needs a CUDA GPU", file=sys.stderr)
        return 2
    results = {}
    print(f"{args.dtype}, head dim {args.head_dim}, {args.heads} heads x {args.seqlen_q} query rows, "
          f"keys {KEY_BLOCKS[0] * ROWS_PER_BLOCK}-{KEY_BLOCKS[-1] * ROWS_PER_BLOCK}; per 128-row query block:")
    for peer in args.peers.split(","):
        try:
            r = measure(peer, args.dtype, args.head_dim, args.seqlen_q, args.heads)
        except RuntimeError as exc:
            print(f"  {peer:<14} refused: {refusal_text(exc)}")
            continue
        results[peer] = r
        calls = ", ".join(f"{n}: {t:.1f}" for n, t in r["us_per_call"].items())
        print(f"  {peer:<14} fixed {r['fixed_us']:5.2f} us, per key block {r['per_key_block_us']:5.2f} us"
              f"   (us per call by key blocks: {calls})")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "device": torch.cuda.get_device_name(),
                                               "torch": torch.__version__, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
