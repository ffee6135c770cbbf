"""flash-attn's functions on the GPU as torch operators: torch.compile with
the default backend (inductor) and fullgraph, forward and backward equal to
eager; a CUDA graph recording flash_attn_func and flash_attn_varlen_func
replays to the float32 reference; the host time of a tiny call beside the
SDPA route's (printed, not judged: speed lives in benchmarks). Skipped
without a GPU or an installed image for its arch."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

import aotriton_rocm
from support import attn_reference as ref
from support import gpu

pytestmark = pytest.mark.gpu



def _rand(*shape, seed=0, dtype=torch.float16):
    gen = torch.Generator("cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=gen).to(dtype)


def _judge_out(out_bshd, q, k, v, **kw):
    """out (B, S, H, D) against the float32 math reference."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    g = torch.zeros_like(qt)
    golden = ref.attention(qt, kt, vt, g, dtype=ref.golden_dtype(q.dtype), **kw)
    lp = ref.attention(qt, kt, vt, g, dtype=q.dtype, **kw)
    ref.check("out", out_bshd.transpose(1, 2), golden["out"], lp["out"], q.dtype)


@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
def test_compiled_flash_attn_func_equals_eager(dropout_p):
    q, k, v = _rand(2, 256, 8, 128, seed=1), _rand(2, 384, 4, 128, seed=2), _rand(2, 384, 4, 128, seed=3)

    def fn(q, k, v):
        return aotriton_rocm.flash_attn_func(q, k, v, dropout_p=dropout_p, causal=True)

    explained = torch._dynamo.explain(fn)(q, k, v)
    assert explained.graph_break_count == 0, explained.break_reasons
    results = []
    for run in (fn, torch.compile(fn, fullgraph=True)):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        torch.manual_seed(5)
        out = run(*leaves)
        out.backward(torch.ones_like(out))
        results.append([out.detach()] + [t.grad for t in leaves])
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


def test_cuda_graph_records_flash_attn_func():
    q, k, v = _rand(2, 128, 8, 64, seed=4), _rand(2, 200, 8, 64, seed=5), _rand(2, 200, 8, 64, seed=6)
    graph, out = gpu.captured(lambda: aotriton_rocm.flash_attn_func(q, k, v, causal=True))
    for seed in (7, 8):
        q.copy_(_rand(*q.shape, seed=seed))
        graph.replay()
        torch.cuda.synchronize()
        _judge_out(out, q, k, v, causal=True)


def test_cuda_graph_records_flash_attn_varlen_func():
    lens = [37, 100, 5]
    cu = torch.tensor([0, 37, 137, 142], dtype=torch.int32, device="cuda")
    q, k, v = (_rand(142, 4, 64, seed=s) for s in (9, 10, 11))
    graph, out = gpu.captured(
        lambda: aotriton_rocm.flash_attn_varlen_func(q, k, v, cu, cu, 100, 100, causal=True))
    graph.replay()
    torch.cuda.synchronize()
    start = 0
    for n in lens:
        rows = slice(start, start + n)
        _judge_out(out[rows][None], q[rows][None], k[rows][None], v[rows][None], causal=True)
        start += n


def test_host_time_of_a_tiny_call():
    """Host microseconds per call (median of 200, after warm-up) of a 1x1x128x64
    flash_attn_func and of SDPA through the enabled route; printed."""
    q, k, v = (_rand(1, 128, 1, 64, seed=s) for s in (1, 2, 3))

    def per_call(fn):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(200):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        return sorted(times)[len(times) // 2] * 1e6

    flash = per_call(lambda: aotriton_rocm.flash_attn_func(q, k, v))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    aotriton_rocm.enable()
    try:
        sdpa = per_call(lambda: F.scaled_dot_product_attention(qt, kt, vt))
        flash_enabled = per_call(lambda: aotriton_rocm.flash_attn_func(q, k, v))
    finally:
        aotriton_rocm.disable()
    print(f"\nhost time per tiny call: flash_attn_func {flash:.1f} us, after enable() "
          f"{flash_enabled:.1f} us, SDPA route {sdpa:.1f} us")
    assert flash > 0 and sdpa > 0


@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(40, 8), softcap=3.0),
                                dict(alibi=True, causal=True)], ids=["causal", "window-softcap", "alibi"])
def test_enabled_cpp_route_serves_flash_attn_func(kw):
    """After enable() (the C++ route), flash_attn_func runs in the extension's
    kernel, no Python route: the result matches the float32 reference."""
    from aotriton_rocm.core import torch_native

    q, k, v = _rand(2, 100, 8, 64, seed=31), _rand(2, 160, 2, 64, seed=32), _rand(2, 160, 2, 64, seed=33)
    kw = dict(kw)
    slopes = torch.rand(8, device="cuda") * 0.3 if kw.pop("alibi", False) else None
    aotriton_rocm.enable()
    try:
        if not torch_native.is_active():
            pytest.skip("the C++ route is not active here")
        before = torch_native.fallback_count()
        out = aotriton_rocm.flash_attn_func(q, k, v, alibi_slopes=slopes, **kw)
        torch.cuda.synchronize()
        assert torch_native.fallback_count() == before, "the call went to the Python route"
    finally:
        aotriton_rocm.disable()
    window = kw.get("window_size", (-1, -1))
    _judge_out(out, q, k, v, causal=kw.get("causal", False),
               window=(window[0], 0 if kw.get("causal") else window[1]),
               softcap=kw.get("softcap", 0.0), alibi_slopes=slopes)
