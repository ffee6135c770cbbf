"""What a head dim that is not a multiple of 8 costs: each such head dim
beside the next multiple of 8 (the kernels run that one on zero-padded
copies), same B, H, S, on both routes:

- ``op``: ``aten._scaled_dot_product_flash_attention`` (+ its backward)
  called directly with us enabled (torch >= 2.10: the C++ route, where
  libaotriton_rocm makes the copies; SDPA on CUDA builds would pad the head
  dim itself before calling the op);
- ``flash_attn``: ``aotriton_rocm.flash_attn_func`` ((B, S, H, D), the
  Python route's copies);
- ``kvcache``: ``flash_attn_with_kvcache`` decoding (one query row against
  a cache of S keys; the whole cache is copied per call at such head dims).

Prints milliseconds per call (median of CUDA-event timings) and the ratio.
Usage: python benchmarks/bench_head_dims.py [--pairs 59:64,111:112,203:208]
[--seqlen 4096] [--batch 4] [--heads 16] [--dtype bf16] [--reps 10]"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

import aotriton_rocm
from bench_attention import _times_ms

FLASH = torch.ops.aten._scaled_dot_product_flash_attention.default
FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_backward.default


def _rand(*shape, dtype):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def cases(b, h, s, d, dtype):
    """{name: callable} of one head dim."""
    q, k, v, g = (_rand(b, h, s, d, dtype=dtype) for _ in range(4))
    out, lse, cq, ck, mq, mk, seed, offset, _ = FLASH(q, k, v, 0.0, True, False)

    def op_fwd():
        FLASH(q, k, v, 0.0, True, False)

    def op_bwd():
        FLASH_BWD(g, q, k, v, out, lse, cq, ck, mq, mk, 0.0, True, seed, offset)

    qf, kf, vf = (t.transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v))
    gf = g.transpose(1, 2).contiguous()

    def fa_fwd():
        with torch.no_grad():
            aotriton_rocm.flash_attn_func(qf, kf, vf, causal=True)

    def fa_fwd_bwd():
        torch.autograd.grad(aotriton_rocm.flash_attn_func(qf, kf, vf, causal=True),
                            (qf, kf, vf), gf)

    fns = {"op fwd": op_fwd, "op bwd": op_bwd, "flash_attn fwd": fa_fwd,
           "flash_attn fwd+bwd": fa_fwd_bwd}
    if d <= 256:  # the KV-cache kernels' limit
        qd = _rand(b, 1, h, d, dtype=dtype)
        kc, vc = (_rand(b, s, max(1, h // 4), d, dtype=dtype) for _ in range(2))
        lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
        fns["kvcache decode"] = lambda: aotriton_rocm.flash_attn_with_kvcache(
            qd, kc, vc, cache_seqlens=lens)
    return fns


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default="59:64,111:112,203:208")
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dtype", default="bf16", choices=("fp16", "bf16"))
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_head_dims needs a GPU", file=sys.stderr)
        return 2
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    aotriton_rocm.enable()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, B={args.batch} "
          f"H={args.heads} S={args.seqlen} {args.dtype}, causal; ms per call")
    for pair in args.pairs.split(","):
        odd, even = (int(x) for x in pair.split(":"))
        times = {}
        for d in (odd, even):
            for name, fn in cases(args.batch, args.heads, args.seqlen, d, dtype).items():
                times[(name, d)] = statistics.median(_times_ms(fn, args.reps))
        for name in ("op fwd", "op bwd", "flash_attn fwd", "flash_attn fwd+bwd",
                     "kvcache decode"):
            if (name, odd) not in times or (name, even) not in times:
                continue
            a, b = times[(name, odd)], times[(name, even)]
            print(f"  {name:20s} d={odd:3d} {a:8.3f}  d={even:3d} {b:8.3f}  ratio {a / b:5.2f}")
    aotriton_rocm.disable()
    return 0


if __name__ == "__main__":
    sys.exit(main())
