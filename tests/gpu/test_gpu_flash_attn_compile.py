"""flash-attn's seven functions on the GPU as torch operators: each under
torch.compile (inductor, fullgraph) with no graph break, forward and backward
equal to eager; each recorded in a CUDA graph whose replay equals eager; the
C++ extension serving them from the first call, without enable(); the host
time of a tiny call beside the SDPA route's (printed, not judged: speed lives
in benchmarks). Skipped without a GPU or an installed image for its arch."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

import aotriton_rocm
from aotriton_rocm.core import torch_native
from support import attn_reference as ref
from support import gpu

pytestmark = pytest.mark.gpu

B, S, H, HK, D = 2, 96, 8, 2, 64
LENS = [37, 100, 5]


def _rand(*shape, seed=0, dtype=torch.float16):
    gen = torch.Generator("cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=gen).to(dtype)


def _cu(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")


def _judge_out(out_bshd, q, k, v, **kw):
    """out (B, S, H, D) against the float32 math reference."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    g = torch.zeros_like(qt)
    golden = ref.attention(qt, kt, vt, g, dtype=ref.golden_dtype(q.dtype), **kw)
    lp = ref.attention(qt, kt, vt, g, dtype=q.dtype, **kw)
    ref.check("out", out_bshd.transpose(1, 2), golden["out"], lp["out"], q.dtype)


def _case(name: str):
    """(function of tensors, its input tensors, differentiable) for each of
    flash-attn's seven functions: causal, GQA where the form allows it."""
    cu, total, longest = _cu(LENS), sum(LENS), max(LENS)
    f = getattr(aotriton_rocm, name)
    if name == "flash_attn_func":
        return (lambda q, k, v: f(q, k, v, causal=True, window_size=(48, -1)),
                [_rand(B, S, H, D, seed=1), _rand(B, S + 40, HK, D, seed=2),
                 _rand(B, S + 40, HK, D, seed=3)], True)
    if name == "flash_attn_qkvpacked_func":
        return (lambda qkv: f(qkv, causal=True), [_rand(B, S, 3, H, D, seed=4)], True)
    if name == "flash_attn_kvpacked_func":
        return (lambda q, kv: f(q, kv, causal=True, softcap=4.0),
                [_rand(B, S, H, D, seed=5), _rand(B, S + 8, 2, HK, D, seed=6)], True)
    if name == "flash_attn_varlen_func":
        return (lambda q, k, v: f(q, k, v, cu, cu, longest, longest, causal=True),
                [_rand(total, H, D, seed=7), _rand(total, HK, D, seed=8),
                 _rand(total, HK, D, seed=9)], True)
    if name == "flash_attn_varlen_qkvpacked_func":
        return (lambda qkv: f(qkv, cu, longest, causal=True), [_rand(total, 3, H, D, seed=10)],
                True)
    if name == "flash_attn_varlen_kvpacked_func":
        return (lambda q, kv: f(q, kv, cu, cu, longest, longest),
                [_rand(total, H, D, seed=11), _rand(total, 2, HK, D, seed=12)], True)
    assert name == "flash_attn_with_kvcache"
    seqlens = torch.tensor([100, 37], dtype=torch.int32, device="cuda")

    def decode_step(q, k_cache, v_cache, k, v):
        return f(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=True)
    return (decode_step, [_rand(B, 1, H, D, seed=13), _rand(B, 256, HK, D, seed=14),
                          _rand(B, 256, HK, D, seed=15), _rand(B, 1, HK, D, seed=16),
                          _rand(B, 1, HK, D, seed=17)], False)


SEVEN = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
         "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
         "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache"]


def _run(fn, inputs, differentiable):
    """(outputs, input gradients) of one call on fresh copies of the inputs
    (the KV cache's are appended to in place)."""
    leaves = [t.clone().requires_grad_(differentiable) for t in inputs]
    out = fn(*leaves)
    if not differentiable:
        return [out.detach()] + leaves, []
    out.backward(torch.ones_like(out))
    return [out.detach()], [t.grad for t in leaves]


@pytest.mark.parametrize("name", SEVEN)
def test_compiled_function_equals_eager(name):
    fn, inputs, differentiable = _case(name)
    explained = torch._dynamo.explain(fn)(*inputs)
    assert explained.graph_break_count == 0, explained.break_reasons
    eager = _run(fn, inputs, differentiable)
    torch._dynamo.reset()
    compiled = _run(torch.compile(fn, fullgraph=True), inputs, differentiable)
    for a, b in zip(eager[0] + eager[1], compiled[0] + compiled[1]):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_compiled_dropout_equals_eager():
    q, k, v = _rand(2, 256, 8, 128, seed=1), _rand(2, 384, 4, 128, seed=2), _rand(2, 384, 4, 128, seed=3)

    def fn(q, k, v):
        return aotriton_rocm.flash_attn_func(q, k, v, dropout_p=0.2, causal=True)

    results = []
    for run in (fn, torch.compile(fn, fullgraph=True)):
        torch.manual_seed(5)
        results.append(_run(run, [q, k, v], True))
    for a, b in zip(results[0][0] + results[0][1], results[1][0] + results[1][1]):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


@pytest.mark.parametrize("name", SEVEN)
def test_cuda_graph_replay_equals_eager(name):
    fn, inputs, _ = _case(name)
    with torch.no_grad():
        graph, out = gpu.captured(lambda: fn(*inputs))
        for seed in (21, 22):
            inputs[0].copy_(_rand(*inputs[0].shape, seed=seed))
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(out, fn(*inputs), rtol=0, atol=0)


def test_cuda_graph_of_flash_attn_func_matches_the_reference():
    q, k, v = _rand(2, 128, 8, 64, seed=4), _rand(2, 200, 8, 64, seed=5), _rand(2, 200, 8, 64, seed=6)
    graph, out = gpu.captured(lambda: aotriton_rocm.flash_attn_func(q, k, v, causal=True))
    q.copy_(_rand(*q.shape, seed=7))
    graph.replay()
    torch.cuda.synchronize()
    _judge_out(out, q, k, v, causal=True)


def test_cpp_route_serves_the_operators_without_enable():
    """No enable(): the first GPU call puts our operators (only) on the C++
    kernels; forward, backward and the KV cache then run there, with no
    Python route, and results that match the float32 reference."""
    aotriton_rocm.disable()
    torch_native.deactivate()
    q, k, v = (_rand(2, 100, 8, 64, seed=s).requires_grad_() for s in (31, 32, 33))
    aotriton_rocm.flash_attn_func(q, k, v)  # activates
    if not torch_native.is_active():
        pytest.skip("the C++ route is not available here (torch < 2.10 or no extension)")
    assert not aotriton_rocm.is_enabled()
    assert "aotriton_rocm_torch.cpp" not in torch._C._dispatch_dump(
        "aten::_scaled_dot_product_flash_attention")
    before, launches = torch_native.fallback_count(), torch_native.launch_count()
    out = aotriton_rocm.flash_attn_func(q, k, v, causal=True, softcap=3.0)
    out.backward(torch.ones_like(out))
    fn, inputs, _ = _case("flash_attn_with_kvcache")
    with torch.no_grad():
        fn(*inputs)
    torch.cuda.synchronize()
    assert torch_native.fallback_count() == before, "a call went to the Python route"
    assert torch_native.launch_count() >= launches + 5  # forward, 3 (or 2 fused) backward, kv
    _judge_out(out.detach(), q.detach(), k.detach(), v.detach(), causal=True, softcap=3.0)


@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(40, 8), softcap=3.0),
                                dict(alibi=True, causal=True)], ids=["causal", "window-softcap", "alibi"])
def test_enabled_cpp_route_serves_flash_attn_func(kw):
    """After enable() (the C++ route), flash_attn_func runs in the extension's
    kernel, no Python route: the result matches the float32 reference."""
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


def test_cpp_route_serves_packed_batches():
    """flash_attn_varlen_func without dropout: forward and backward in the
    extension's kernels (offsets checked by the library), no Python route;
    each sequence's output and gradients match the float32 reference."""
    lens_q, lens_k = [37, 100, 5], [60, 100, 9]
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    q = _rand(sum(lens_q), H, D, seed=41).requires_grad_()
    k, v = (_rand(sum(lens_k), HK, D, seed=s).requires_grad_() for s in (42, 43))
    do = _rand(sum(lens_q), H, D, seed=44)
    aotriton_rocm.flash_attn_func(*(t[None, :5].detach() for t in (q, k, v)))  # activates
    if not torch_native.is_active():
        pytest.skip("the C++ route is not available here (torch < 2.10 or no extension)")
    before = torch_native.fallback_count()
    out = aotriton_rocm.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                               causal=True, window_size=(30, -1), softcap=4.0)
    out.backward(do)
    torch.cuda.synchronize()
    assert torch_native.fallback_count() == before, "a call went to the Python route"
    mask = dict(causal=True, window=(30, 0), softcap=4.0)
    for i in range(len(lens_q)):
        rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        seq = lambda t, r: t.detach()[r].transpose(0, 1)[None]  # noqa: E731
        ref.check_all({"out": seq(out, rq), "dq": seq(q.grad, rq), "dk": seq(k.grad, rk),
                       "dv": seq(v.grad, rk)},
                      seq(q, rq), seq(k, rk), seq(v, rk), seq(do, rq), **mask)


def test_operators_called_with_a_tensor_elsewhere_say_which():
    """Our operators called directly (past flash_attn_func's checks) with a
    tensor on another device: the C++ kernel hands the call on and the
    caller gets the Python route's refusal, not a fault."""
    from aotriton_rocm.integrations import flash_attn_ops
    q = _rand(1, 16, 2, 64, seed=51)
    aotriton_rocm.flash_attn_func(q, q, q)  # activates the C++ route
    for k, v in ((q.cpu(), q), (q, q.cpu())):
        with pytest.raises(ValueError, match="on one device"):
            flash_attn_ops.forward(q, k, v, None, None, 16, 16, 0.0, None, False, -1, -1, 0.0,
                                   None, False, False)
    cache = _rand(1, 32, 2, 64, seed=52)
    with pytest.raises(ValueError, match="cache_seqlens must be on"):
        flash_attn_ops.refusal_kept(
            flash_attn_ops.flash_attn_kvcache, q, cache, cache,
            torch.tensor([20], dtype=torch.int32), None, None, None, None, None, False, -1, -1,
            0.0, 1, None, 0, "flash_attn_with_kvcache")


def _per_call(fn):
    """Host microseconds per call: the median of 200, after warm-up."""
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


def test_host_time_of_a_tiny_call():
    """A 1x128x1x64 flash_attn_func, a one-token flash_attn_with_kvcache step
    (with and without appending k/v), and SDPA through the enabled route,
    side by side in one process; printed."""
    q, k, v = (_rand(1, 128, 1, 64, seed=s) for s in (1, 2, 3))
    qd, kc, vc = _rand(1, 1, 8, 64, seed=4), _rand(1, 256, 8, 64, seed=5), _rand(1, 256, 8, 64, seed=6)
    kn, vn = _rand(1, 1, 8, 64, seed=7), _rand(1, 1, 8, 64, seed=8)
    lens = torch.tensor([100], dtype=torch.int32, device="cuda")
    calls = {
        "flash_attn_func": lambda: aotriton_rocm.flash_attn_func(q, k, v),
        "flash_attn_with_kvcache": lambda: aotriton_rocm.flash_attn_with_kvcache(
            qd, kc, vc, cache_seqlens=lens),
        "flash_attn_with_kvcache + append": lambda: aotriton_rocm.flash_attn_with_kvcache(
            qd, kc, vc, kn, vn, cache_seqlens=lens),
    }
    times = {name: _per_call(fn) for name, fn in calls.items()}
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    aotriton_rocm.enable()
    try:
        times["SDPA route (enabled)"] = _per_call(lambda: F.scaled_dot_product_attention(qt, kt, vt))
        times["flash_attn_func (enabled)"] = _per_call(calls["flash_attn_func"])
    finally:
        aotriton_rocm.disable()
    print("\nhost time per tiny call: " + ", ".join(f"{n} {t:.1f} us" for n, t in times.items()))
    assert all(t > 0 for t in times.values())
