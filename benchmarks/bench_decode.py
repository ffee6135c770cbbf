"""Decode speed (Sq = 1 against a long KV cache): aotriton-rocm's
flash_attn_with_kvcache (dense and paged caches, automatic split-KV) against
torch's SDPA backends (FLASH, CUDNN, EFFICIENT, where they run) on the same
keys and values gathered into a contiguous cache.

    python benchmarks/bench_decode.py [--json FILE] [--quick]

Llama-style GQA shape: 32 query heads, 8 key/value heads, head dim 128, fp16,
batch 1 and 8, Sk = 8k and 128k; pages of 256. Per row: microseconds per call
(median of CUDA-event timings over calls queued back to back, as in a serving
loop) and the effective bandwidth of reading K and V once (B * Sk * Hkv * D *
2 tensors * 2 bytes / time). torch's backends that do not take GQA
(enable_gqa) get K/V expanded to the query heads beforehand, outside the
timing, and are marked so (they then read 4x the bytes). A benchmark, not a
test: numbers are measured on whatever GPU runs it, never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import aotriton_rocm

HEADS, HEADS_K, HEAD_DIM, PAGE = 32, 8, 128, 256
BACKENDS = {"torch FLASH": SDPBackend.FLASH_ATTENTION, "torch CUDNN": SDPBackend.CUDNN_ATTENTION,
            "torch EFFICIENT": SDPBackend.EFFICIENT_ATTENTION}


def _median_us(fn, reps: int = 20, calls: int = 10, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


def _paged(k, v, gen):
    """The (B, Sk, Hk, D) caches as pages of PAGE rows in a shuffled block order."""
    b, sk, hk, d = k.shape
    per = sk // PAGE
    table = torch.randperm(b * per, device="cuda", generator=gen).view(b, per).int()
    kp = torch.empty(b * per, PAGE, hk, d, dtype=k.dtype, device="cuda")
    vp = torch.empty_like(kp)
    kp[table.long()] = k.view(b, per, PAGE, hk, d)
    vp[table.long()] = v.view(b, per, PAGE, hk, d)
    return kp, vp, table


def bench_case(b: int, sk: int) -> list[dict]:
    gen = torch.Generator("cuda").manual_seed(b * sk)
    q = torch.randn(b, 1, HEADS, HEAD_DIM, device="cuda", generator=gen).half()
    k = torch.randn(b, sk, HEADS_K, HEAD_DIM, device="cuda", generator=gen).half()
    v = torch.randn(b, sk, HEADS_K, HEAD_DIM, device="cuda", generator=gen).half()
    seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    kv_bytes = 2 * k.numel() * k.element_size()
    rows = []

    def add(peer, us, out, note=""):
        err = (out.float().reshape(b, HEADS, HEAD_DIM)
               - reference.float().reshape(b, HEADS, HEAD_DIM)).abs().max().item()
        rows.append({"batch": b, "seqlen_k": sk, "peer": peer, "us": round(us, 2),
                     "GB/s": round(kv_bytes / us / 1e3, 1), "max_err_vs_dense": err,
                     "note": note})

    def dense():
        return aotriton_rocm.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)
    reference = dense()
    add("aotriton-rocm dense", _median_us(dense), reference)
    kp, vp, table = _paged(k, v, gen)

    def paged():
        return aotriton_rocm.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlens,
                                                     block_table=table)
    add(f"aotriton-rocm paged {PAGE}", _median_us(paged), paged())
    kp = vp = None  # free the paged copy before the peers run

    # torch on the gathered contiguous cache, (B, H, S, D) views
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    expanded = None
    for peer, backend in BACKENDS.items():
        def call(kk=kt, vv=vt, gqa=True):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kk, vv, enable_gqa=gqa)
        try:
            out = call()
            note = ""
            fn = call
        except RuntimeError:
            try:
                if expanded is None:
                    group = HEADS // HEADS_K
                    expanded = (kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1))
                out = call(*expanded, gqa=False)
                note = "K/V expanded to the query heads"
                fn = lambda: call(*expanded, gqa=False)  # noqa: E731
            except RuntimeError as exc:
                rows.append({"batch": b, "seqlen_k": sk, "peer": peer, "us": None, "GB/s": None,
                             "note": f"does not run: {str(exc).splitlines()[0][:80]}"})
                continue
        add(peer, _median_us(fn), out.transpose(1, 2), note)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write all numbers here")
    parser.add_argument("--quick", action="store_true", help="Sk = 8k only")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, aotriton-rocm "
          f"{aotriton_rocm.__version__}; fp16 decode, H={HEADS} Hkv={HEADS_K} D={HEAD_DIM}")
    rows = []
    for sk in (8192,) if args.quick else (8192, 131072):
        for b in (1, 8):
            rows += bench_case(b, sk)
            torch.cuda.empty_cache()
    print(f"{'B':>2} {'Sk':>7} {'peer':<26} {'us':>9} {'GB/s':>8}  note")
    for r in rows:
        us = "-" if r["us"] is None else f"{r['us']:.1f}"
        gbs = "-" if r["GB/s"] is None else f"{r['GB/s']:.0f}"
        print(f"{r['batch']:>2} {r['seqlen_k']:>7} {r['peer']:<26} {us:>9} {gbs:>8}  {r['note']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
