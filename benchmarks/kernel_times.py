"""Where one attention pass spends its GPU time, kernel by kernel: ours
beside torch's FLASH and CUDNN backends, from torch.profiler's CUDA trace.

    python benchmarks/kernel_times.py [--dtype bf16] [--head-dim 128] [--seqlen 16384]
                                      [--causal] [--decode] [--pass bwd] [--json FILE]

The shape is one of bench_attention.py's standard ones (B*S = 16k tokens,
H*D = 2048), or with --decode its decode shape (Sq = 1, Sk = 8k). Each
backend runs the pass a few times after warm-up; the table lists each
kernel's mean time per pass and share of the pass. Use it to see which of
our kernels limits a cell of bench_attention.py's table.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from bench_attention import (Shape, add_one_shape_arguments, make_inputs, one_shape, pass_fns,  # noqa: E402
                             refusal_text, sdpa_call, sdpa_on, shape_text)

RUNS = 5


def kernel_times(peer: str, shape: Shape, pass_name: str) -> dict:
    """{kernel name: mean microseconds per pass} for one backend."""
    q, k, v, grad = make_inputs(shape)
    with sdpa_on(peer):
        fn = pass_fns(sdpa_call(shape), q, k, v, grad)[pass_name]
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(RUNS):
                fn()
            torch.cuda.synchronize()
    totals: dict = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time / RUNS
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_one_shape_arguments(parser)
    parser.add_argument("--json", type=Path, help="write the times here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernel_times needs a GPU", file=sys.stderr)
        return 2
    shape = one_shape(args)
    report = {"gpu": torch.cuda.get_device_name(), "shape": asdict(shape), "pass": args.pass_name,
              "us_per_pass": {}}
    print(f"{report['gpu']}: {shape_text(report['shape'])}, {args.pass_name}, mean us per pass")
    for peer in args.peers.split(","):
        try:
            times = kernel_times(peer, shape, args.pass_name)
        except RuntimeError as exc:  # a backend that refuses the shape
            print(f"\n{peer}: {refusal_text(exc)}")
            continue
        report["us_per_pass"][peer] = times
        total = sum(times.values())
        print(f"\n{peer}: {total:.0f} us")
        for name, us in times.items():
            print(f"  {us:9.1f} us {100 * us / total:5.1f}%  {name[:110]}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
