"""Host cost of one SDPA call at a tiny shape (B=1 H=1 S=128 D=64, fp16):
aotriton-rocm beside torch's FLASH and CUDNN backends, where launch overhead,
not the kernel, sets the time.

    python benchmarks/bench_call_overhead.py [--calls 2000] [--json FILE]

Wall microseconds per call over back-to-back calls, GPU work included. Our
row also shows where the time goes: `attention.forward` alone (no
dispatcher, no coverage check) and `unsupported_reason` alone. The kernel
throughput benchmark is bench_attention.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import aotriton_rocm
from aotriton_rocm.core import attention

TORCH_PEERS = {"torch FLASH": SDPBackend.FLASH_ATTENTION,
               "torch CUDNN": SDPBackend.CUDNN_ATTENTION}


def _host_us(fn, calls: int) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def measure(calls: int) -> dict:
    q = torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16)

    def sdpa():
        return F.scaled_dot_product_attention(q, q, q)

    result = {}
    aotriton_rocm.enable()
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            result["aotriton-rocm"] = _host_us(sdpa, calls)
    finally:
        aotriton_rocm.disable()
    for name, backend in TORCH_PEERS.items():
        try:
            with sdpa_kernel(backend):
                result[name] = _host_us(sdpa, calls)
        except RuntimeError as exc:
            result[name] = f"error: {str(exc).splitlines()[0]}"
    result["aotriton-rocm attention.forward"] = _host_us(lambda: attention.forward(q, q, q), calls)
    result["aotriton-rocm unsupported_reason"] = _host_us(
        lambda: attention.unsupported_reason(q, q, q), calls)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", help="write the numbers here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_call_overhead needs a GPU", file=sys.stderr)
        return 2
    result = measure(args.calls)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: host us per tiny SDPA call")
    for name, us in result.items():
        print(f"  {name:<34} {us if isinstance(us, str) else f'{us:.1f}'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "us_per_call": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
