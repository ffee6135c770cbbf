"""Any head dim from 1 to 512 on every Python route, on CPU tensors (kernel
sources in Triton's interpreter), against the float32/float64 math
reference: flash-attn's functions (forward and backward, dropout with its
mask, varlen, the KV cache up to 256), torch's flash and efficient ops
(attn_bias and its gradient), AttentionMode. Head dims that are not
multiples of 8 run on zero-padded copies; the copies must not leak into
the results (shapes, the untouched padding of caller-owned outputs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import aotriton_rocm
from support import attn_reference as ref
from support import kvcache_reference as kv_ref
from support import philox_reference
from aotriton_rocm.core import attention, backends
from aotriton_rocm.commands import smoke
from aotriton_rocm.integrations import torch_integration

pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")

HEAD_DIMS = [1, 3, 40, 59, 72, 100, 111, 160, 203, 512]


def _bshd(b, sq, sk, h, hk, d, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, g = (torch.randn(b, s, n, d, generator=gen).to(dtype)
                  for s, n in ((sq, h), (sk, hk), (sk, hk), (sq, h)))
    return q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True), g


def _t(x):
    return x.detach().transpose(1, 2)


def test_coverage_is_one_to_512():
    q = torch.zeros(1, 1, 4, 1, dtype=torch.float16)
    assert attention.unsupported_reason(q, q, q) is None
    for d in (0, 513):
        q = torch.zeros(1, 1, 4, d, dtype=torch.float16)
        assert f"head_dim {d} is not covered (1 to 512 are)" in attention.unsupported_reason(q, q, q)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_flash_attn_func_forward_backward(d):
    dtype = torch.bfloat16 if d in (3, 111) else torch.float16
    causal = d % 2 == 1
    q, k, v, g = _bshd(1, 9, 13, 2, 1, d, dtype, seed=d)  # GQA, bottom-right causal
    backends.reset_launch_counts()
    out = aotriton_rocm.flash_attn_func(q, k, v, causal=causal)
    assert out.shape == q.shape and out.stride() == q.stride()
    out.backward(g)
    assert backends.launch_counts()[("interpreter:cpu", "attn_fwd")] == 1
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
    ref.check_all({"out": _t(out), "dq": _t(q.grad), "dk": _t(k.grad), "dv": _t(v.grad)},
                  _t(q), _t(k), _t(v), _t(g), causal=causal)


def test_fp32_head_dim_203_with_scale():
    q, k, v, g = _bshd(1, 7, 5, 1, 1, 203, torch.float32, seed=3)
    out = aotriton_rocm.flash_attn_func(q, k, v, softmax_scale=0.1)
    out.backward(g)
    ref.check_all({"out": _t(out), "dq": _t(q.grad), "dk": _t(k.grad), "dv": _t(v.grad)},
                  _t(q), _t(k), _t(v), _t(g), scale=0.1)


@pytest.mark.parametrize("d", [59, 111])
def test_dropout_with_its_mask(d):
    p, sq, sk, h = 0.3, 11, 14, 2
    q, k, v, g = _bshd(1, sq, sk, h, h, d, torch.float16, seed=d + 1)
    torch.manual_seed(5)
    state = tuple(attention.new_rng_state(torch.device("cpu")))
    torch.manual_seed(5)
    out, lse, dmask = aotriton_rocm.flash_attn_func(q, k, v, dropout_p=p, causal=True,
                                                    return_attn_probs=True)
    keep = philox_reference.keep_mask_for(state, (1, h, sq, sk), p)
    vis = ref.visible(sq, sk, True)
    assert torch.equal((dmask[:, :, :sq, :sk] >= 0)[..., vis], keep[..., vis])
    out.backward(g)
    ref.check_all({"out": _t(out), "lse": lse, "dq": _t(q.grad), "dk": _t(k.grad),
                   "dv": _t(v.grad)}, _t(q), _t(k), _t(v), _t(g), causal=True, keep=keep,
                  dropout_p=p)


@pytest.mark.parametrize("d", [3, 111])
def test_varlen(d):
    lens_q, lens_k, h = [5, 0, 9], [7, 4, 6], 2
    gen = torch.Generator().manual_seed(d)
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32)
                  for n in (lens_q, lens_k))
    q, k, v = (torch.randn(sum(n), h, d, generator=gen).half().requires_grad_(True)
               for n in (lens_q, lens_k, lens_k))
    g = torch.randn(q.shape, generator=gen).half()
    out = aotriton_rocm.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                               causal=True)
    assert out.shape == q.shape
    out.backward(g)
    for i in range(len(lens_q)):
        rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rk = slice(int(cu_k[i]), int(cu_k[i + 1]))

        def seq(t, rows):
            return t.detach()[rows].transpose(0, 1).unsqueeze(0)

        if rq.start == rq.stop:
            assert not k.grad[rk].any() and not v.grad[rk].any()
            continue
        ref.check_all({"out": seq(out, rq), "dq": seq(q.grad, rq), "dk": seq(k.grad, rk),
                       "dv": seq(v.grad, rk)}, seq(q, rq), seq(k, rk), seq(v, rk), seq(g, rq),
                      causal=True)


@pytest.mark.parametrize("d,bias_shape", [(59, (1, 2, 6, 10)), (203, (6, 10))])
def test_efficient_op_with_bias_and_its_gradient(d, bias_shape):
    gen = torch.Generator().manual_seed(d)
    q = torch.randn(1, 2, 6, d, generator=gen).half()
    k, v = (torch.randn(1, 2, 10, d, generator=gen).half() for _ in range(2))
    g = torch.randn(q.shape, generator=gen).half()
    bias = torch.randn(bias_shape, generator=gen).half()
    out, lse, seed, offset = torch_integration.efficient_attention_forward(
        q, k, v, bias, True, is_causal=True)
    assert out.shape == q.shape
    dq, dk, dv, db = torch_integration.efficient_attention_backward(
        g, q, k, v, bias, out, lse, seed, offset, 0.0, [True, True, True, True], is_causal=True)
    assert db.shape == bias.shape
    full = bias.expand(1, 2, 6, 10)
    golden = ref.attention(q, k, v, g, causal=True, alignment="top_left", bias=full)
    lp = ref.attention(q, k, v, g, causal=True, alignment="top_left", bias=full,
                       dtype=torch.float16)
    for name, got in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        ref.check(name, got, golden[name], lp[name], torch.float16)
    ref.check("dbias", db, golden["dbias"].sum_to_size(bias_shape),
              lp["dbias"].sum_to_size(bias_shape), torch.float16)


@pytest.mark.parametrize("d", [59, 203])
def test_sdpa_through_torchs_cpu_flash_op(d):
    aotriton_rocm.enable(cpu_interpreter=True)
    try:
        case = smoke.Case(torch.float16, d, True, 11, batch=1, heads=2)
        result = smoke.run_case(case, torch.device("cpu"), torch.Generator().manual_seed(1))
    finally:
        aotriton_rocm.disable()
    assert result.passed, (result.errors, result.tolerances, result.note)
    assert result.backend == "interpreter:cpu"


def test_attention_mode_with_a_boolean_mask():
    d = 100 + 1
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, d, generator=gen).half().requires_grad_(True)
               for n in (7, 9, 9))
    g = torch.randn(q.shape, generator=gen).half()
    mask = torch.rand(7, 9, generator=gen) > 0.3
    mask[:, 0] = True
    backends.reset_launch_counts()
    with aotriton_rocm.AttentionMode() as mode:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(g)
    assert not mode.passed_through
    assert backends.launch_counts()[("interpreter:cpu", "attn_fwd")] == 1
    bias = torch.zeros(7, 9).masked_fill(~mask, float("-inf"))
    ref.check_all({"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad},
                  q.detach(), k.detach(), v.detach(), g, bias=bias)


def test_caller_owned_outputs_keep_their_padding():
    """``out`` / ``grads`` views of wider buffers: the copies back write the
    real head dim only."""
    d = 59
    q, k, v, g = (t.detach().transpose(1, 2) for t in _bshd(1, 5, 6, 1, 1, d, torch.float16, 9))
    out_buf = torch.full((1, 1, 5, 64), 7.0, dtype=torch.float16)
    out, lse = attention.forward(q, k, v, out=out_buf[..., :d])
    assert (out_buf[..., d:] == 7).all()
    grads_buf = [torch.full((1, 1, n, 64), 7.0, dtype=torch.float16) for n in (5, 6, 6)]
    attention.backward(g, q, k, v, out, lse, grads=tuple(b[..., :d] for b in grads_buf))
    assert all((b[..., d:] == 7).all() for b in grads_buf)
    ref.check_all({"out": out, "dq": grads_buf[0][..., :d], "dk": grads_buf[1][..., :d],
                   "dv": grads_buf[2][..., :d]}, q, k, v, g)


@pytest.mark.parametrize("d,paged", [(59, False), (203, True)])
def test_kvcache(d, paged):
    dtype, b, sq, h, hk, cache_len, new = torch.float16, 2, 2, 4, 2, 40, 3
    gen = torch.Generator().manual_seed(d)
    q = torch.randn(b, sq, h, d, generator=gen).to(dtype)
    k_cache = torch.randn(b, cache_len, hk, d, generator=gen).to(dtype)
    v_cache = torch.randn(b, cache_len, hk, d, generator=gen).to(dtype)
    k_new, v_new = (torch.randn(b, new, hk, d, generator=gen).to(dtype) for _ in range(2))
    seqlens = torch.tensor([11, 30], dtype=torch.int32)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for bb in range(b):
        n = int(seqlens[bb])
        want_k[bb, n:n + new], want_v[bb, n:n + new] = k_new[bb], v_new[bb]
    table = None
    kc, vc = k_cache, v_cache
    if paged:
        page = 16
        per = cache_len // page + 1
        table = torch.arange(b * per, dtype=torch.int32).flip(0).reshape(b, per)
        kc = torch.zeros(b * per, page, hk, d, dtype=dtype)
        vc = torch.zeros_like(kc)
        for bb in range(b):
            for p in range(per):
                chunk = slice(p * page, min((p + 1) * page, cache_len))
                kc[int(table[bb, p]), :chunk.stop - chunk.start] = k_cache[bb, chunk]
                vc[int(table[bb, p]), :chunk.stop - chunk.start] = v_cache[bb, chunk]
    out, lse = aotriton_rocm.flash_attn_with_kvcache(
        q, kc, vc, k=k_new, v=v_new, cache_seqlens=seqlens, block_table=table, causal=True,
        return_softmax_lse=True)
    assert out.shape == q.shape
    k_end = seqlens + new
    want, want_lse = kv_ref.attention(q, want_k, want_v, k_end, causal=True)
    assert (out.double() - want).abs().max().item() <= 2e-3
    finite = torch.isfinite(want_lse)
    assert (lse.double()[finite] - want_lse[finite]).abs().max().item() <= 1e-4
    # the append landed in the caller's caches, at the real head dim
    got_k = kv_ref.gather(kc, 1, range(int(k_end[1])), block_table=table)
    assert torch.equal(got_k, want_k[1, :int(k_end[1])])


def test_kvcache_refuses_past_256():
    q = torch.zeros(1, 1, 1, 257, dtype=torch.float16)
    cache = torch.zeros(1, 16, 1, 257, dtype=torch.float16)
    with pytest.raises(ValueError, match="head_dim 257 is not covered"):
        aotriton_rocm.flash_attn_with_kvcache(q, cache, cache)
