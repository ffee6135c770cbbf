"""SDPA speed, side by side in one run: aotriton-rocm's precompiled kernels
against torch's FLASH_ATTENTION and CUDNN_ATTENTION backends, and the same
kernel sources through the Triton JIT where triton is installed.

    python benchmarks/bench_sdpa.py [--json FILE] [--quick]

Prints fwd and fwd+bwd TFLOP/s for B=4, H=16, S in {1024, 4096, 8192},
D in {64, 128}, causal and not (fp16), each for a single call from an idle
GPU and for calls queued back to back, then the wall time of one tiny SDPA
call per backend (launch overhead). A benchmark, not a test: numbers are
measured on whatever GPU runs it, never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import aotriton_rocm
from aotriton_rocm import attention

PEERS = ("aotriton-rocm", "torch FLASH", "torch CUDNN")


def _run(peer: str, fn):
    """Run fn with the given peer's attention active."""
    if peer == "aotriton-rocm":
        aotriton_rocm.enable()
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return fn()
        finally:
            aotriton_rocm.disable()
    backend = SDPBackend.FLASH_ATTENTION if peer == "torch FLASH" else SDPBackend.CUDNN_ATTENTION
    with sdpa_kernel(backend):
        return fn()


def _median_ms(fn, reps: int, warmup: int = 3, calls: int = 1) -> float:
    """Median milliseconds per call between CUDA events around `calls`
    back-to-back calls: 1 is a single call's latency from an idle GPU (host
    time before the launch included), more lets the host run ahead of the
    GPU as in a training or serving loop (kernel-bound)."""
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
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


QUEUED = 8  # back-to-back calls per timing in the "queued" columns


def _flops(b, h, s, d, causal):
    f = 4.0 * b * h * s * s * d
    return f / 2 if causal else f


def _triton_jit_forward():
    """Our fwd kernel source compiled by the Triton JIT (None without triton)."""
    try:
        from aotriton_rocm import kernel_spec

        spec = kernel_spec.load_variants(kernel_spec.kernels_dir())
        fn = kernel_spec.jit_function(spec.kernels["attn_fwd"])
    except ImportError:
        return None
    # The unmasked (head_dim == tile width) forward variants, default config.
    variants = {v.functional["head_dim"]: v
                for v in reversed(spec.variants_for(kernel_spec.INTERPRETER_ARCH))
                if v.kernel == "attn_fwd" and v.functional["dtype"] == "fp16"
                and not v.functional["pad_head"]}

    def forward(q, k, v, causal):
        b, h, s, d = q.shape
        variant = variants[d]
        o = torch.empty_like(q)
        lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
        grid = (-(-s // variant.config["BLOCK_M"]), b * h, 1)
        unused_cu = torch.zeros(2, dtype=torch.int32, device=q.device)
        unused_rng = torch.zeros(2, dtype=torch.int64, device=q.device)
        fn[grid](q, k, v, q, o, lse, q, unused_cu, unused_cu, unused_rng, unused_rng,
                 *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], 0, 0, 0,
                 *o.stride()[:3], h * s, s, b, h, 1, s, s, 0, d,
                 *attention.mask_args(causal, s, s), attention.default_scale(d), 0.0, 0,
                 **variant.options, **variant.constexprs)
        return o

    return forward


def bench_throughput(quick: bool) -> list[dict]:
    rows = []
    b, h = 4, 16
    jit_fwd = _triton_jit_forward()
    for d in (64, 128):
        for causal in (False, True):
            for s in ((1024, 4096) if quick else (1024, 4096, 8192)):
                q, k, v, g = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16)
                              for _ in range(4))
                qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
                flops = _flops(b, h, s, d, causal)
                row = {"B": b, "H": h, "S": s, "D": d, "causal": causal}
                reps = 10 if s >= 8192 else 20
                for peer in PEERS:
                    def fwd():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                    def fwd_bwd():
                        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                        out.backward(g)

                    for suffix, calls in (("", 1), (" queued", QUEUED)):
                        try:
                            ms = _run(peer, lambda: _median_ms(fwd, reps, calls=calls))
                            ms_fb = _run(peer, lambda: _median_ms(fwd_bwd, reps, calls=calls))
                            row[f"{peer} fwd{suffix}"] = flops / ms / 1e9
                            row[f"{peer} fwd+bwd{suffix}"] = 3.5 * flops / ms_fb / 1e9
                        except RuntimeError as exc:  # e.g. a backend that refuses this shape
                            row[f"{peer} fwd{suffix}"] = row[f"{peer} fwd+bwd{suffix}"] = None
                            row[f"{peer} error"] = str(exc).splitlines()[0]
                if jit_fwd is not None:
                    ms = _median_ms(lambda: jit_fwd(q, k, v, causal), reps)
                    row["triton JIT fwd"] = flops / ms / 1e9
                rows.append(row)
                print(_fmt_row(row), flush=True)
    return rows


def _fmt_row(row: dict) -> str:
    cells = [f"D{row['D']:<4}{'causal' if row['causal'] else 'full':<7}S{row['S']:<6}"]
    keys = [f"{p} {w}" for w in ("fwd", "fwd+bwd", "fwd queued", "fwd+bwd queued") for p in PEERS]
    for key in keys + ["triton JIT fwd"]:
        if key in row:
            val = row[key]
            cells.append(f"{key}={'n/a' if val is None else f'{val:.0f}'}")
    return "  ".join(cells)


def _host_us(fn, calls: int) -> float:
    """Wall microseconds per call of fn, GPU work included (synchronized)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def bench_tiny_call(calls: int = 2000) -> dict:
    """Host wall time per SDPA call at a tiny shape: the launch-overhead floor."""
    q = torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16)
    result = {}
    for peer in PEERS:
        try:
            result[peer] = _run(peer, lambda: _host_us(
                lambda: F.scaled_dot_product_attention(q, q, q), calls))
        except RuntimeError as exc:
            result[peer] = f"error: {str(exc).splitlines()[0]}"
    # where our time goes: the runtime's forward (no dispatcher, no coverage
    # check), and the coverage check alone
    result["aotriton-rocm attention.forward"] = _host_us(lambda: attention.forward(q, q, q), calls)
    result["aotriton-rocm unsupported_reason"] = _host_us(
        lambda: attention.unsupported_reason(q, q, q), calls)
    jit_fwd = _triton_jit_forward()
    if jit_fwd is not None:
        result["triton JIT (fwd kernel only)"] = _host_us(lambda: jit_fwd(q, q, q, False), calls)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write all numbers here")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tiny-only", action="store_true",
                        help="only the tiny call (host cost per call)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_sdpa needs a GPU")
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"aotriton-rocm {aotriton_rocm.__version__}; TFLOP/s, fp16, median of repeated runs")
    rows = [] if args.tiny_only else bench_throughput(args.quick)
    tiny = bench_tiny_call()
    print("tiny SDPA call (B=1 H=1 S=128 D=64), host us per call:")
    for peer, us in tiny.items():
        print(f"  {peer:<30} {us if isinstance(us, str) else f'{us:.1f}'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows, "tiny_us": tiny}, f,
                      indent=1)


if __name__ == "__main__":
    main()
