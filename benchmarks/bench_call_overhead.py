"""Host cost of one tiny attention call, where launch overhead, not the
kernel, sets the time: SDPA on our kernels (``enable()``) beside torch's
FLASH and CUDNN backends, and flash-attn's API on our kernels
(``flash_attn_func``, a ``flash_attn_with_kvcache`` decode step, with and
without a k/v append).

    python benchmarks/bench_call_overhead.py [--rounds 40] [--calls 50] [--json FILE]

Microseconds per call over back-to-back calls, GPU work included. The
candidates take turns, ``--calls`` calls each per round, so that every one
meets the same host conditions; each figure is the median over the rounds,
and the ratios are against SDPA on our kernels measured in the same run.
The kernel throughput benchmark is bench_attention.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import aotriton_rocm

BASELINE = "SDPA, aotriton-rocm"


def _candidates() -> dict:
    """name -> (uses enable(), SDPA backend or None, the call)."""
    r = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.float16)  # noqa: E731
    q = r(1, 1, 128, 64)  # (B, H, S, D) for SDPA
    qf = q.transpose(1, 2)  # flash-attn's (B, S, H, D)
    qd, kc, vc, kn, vn = r(1, 1, 8, 64), r(1, 256, 8, 64), r(1, 256, 8, 64), r(1, 1, 8, 64), \
        r(1, 1, 8, 64)
    lens = torch.tensor([100], dtype=torch.int32, device="cuda")
    sdpa = lambda: F.scaled_dot_product_attention(q, q, q)  # noqa: E731
    return {
        BASELINE: (True, SDPBackend.FLASH_ATTENTION, sdpa),
        "SDPA, torch FLASH": (False, SDPBackend.FLASH_ATTENTION, sdpa),
        "SDPA, torch CUDNN": (False, SDPBackend.CUDNN_ATTENTION, sdpa),
        "flash_attn_func": (False, None, lambda: aotriton_rocm.flash_attn_func(qf, qf, qf)),
        "flash_attn_with_kvcache": (False, None, lambda: aotriton_rocm.flash_attn_with_kvcache(
            qd, kc, vc, cache_seqlens=lens)),
        "flash_attn_with_kvcache + append": (False, None, lambda: aotriton_rocm.
                                             flash_attn_with_kvcache(qd, kc, vc, kn, vn,
                                                                     cache_seqlens=lens)),
    }


def _per_call_us(fn, calls: int) -> float:
    fn()  # after enable()/disable(), the first call may set its route up
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def measure(candidates: dict, rounds: int, calls: int) -> dict:
    samples: dict = {}
    for _ in range(rounds + 1):  # the first round warms up
        for name, (ours, backend, fn) in candidates.items():
            if isinstance(samples.get(name), str):
                continue  # failed before
            if ours:
                aotriton_rocm.enable()
            try:
                with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                    samples.setdefault(name, []).append(_per_call_us(fn, calls))
            except RuntimeError as exc:
                samples[name] = f"error: {str(exc).splitlines()[0]}"
            finally:
                if ours:
                    aotriton_rocm.disable()
    return {name: s if isinstance(s, str) else statistics.median(s[1:])
            for name, s in samples.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=50, help="calls per candidate per round")
    parser.add_argument("--json", help="write the numbers here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_call_overhead needs a GPU", file=sys.stderr)
        return 2
    result = measure(_candidates(), args.rounds, args.calls)
    base = result.get(BASELINE)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: host us per tiny call "
          f"(median of {args.rounds} rounds of {args.calls} calls)")
    for name, us in result.items():
        if isinstance(us, str):
            print(f"  {name:<36} {us}")
            continue
        ratio = f"  {us / base:.2f}x" if isinstance(base, float) else ""
        print(f"  {name:<36} {us:6.1f}{ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "us_per_call": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
