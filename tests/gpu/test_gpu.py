"""The precompiled kernels on a real GPU (the H100 via the sm_90 target, or an
AMD GPU). Skipped without a GPU or without an installed image for its arch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import aotriton_rocm
from aotriton_rocm.core import backends, device
from aotriton_rocm.commands import smoke
from aotriton_rocm.integrations import torch_integration

pytestmark = pytest.mark.gpu



@pytest.mark.parametrize("case", smoke.gpu_cases(quick=True), ids=lambda c: c.label())
def test_sdpa_matches_math_on_gpu(enabled, case):
    result = smoke.run_case(case, torch.device("cuda"), torch.Generator("cuda").manual_seed(3))
    assert result.passed, (result.errors, result.tolerances, result.note)
    assert result.backend.startswith("aot:")


@pytest.mark.parametrize("seqlen", [5, 129, 300])
def test_odd_seqlens_and_views(enabled, seqlen):
    q = torch.randn(2, seqlen, 4, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(2, 4, seqlen, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 6, seqlen, 128, device="cuda", dtype=torch.bfloat16)[:, 1:5]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert backends.launch_counts()[(f"aot:{device.arch_of(0)}", "attn_fwd")] == 1
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=0)


def test_torch_compile_matches_eager(enabled):
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16) for _ in range(3))

    def attn(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    eager = attn(q, k, v)
    compiled = torch.compile(attn)(q, k, v)
    torch.testing.assert_close(compiled, eager, atol=0, rtol=0)


# --- sliding window, the (B, S, H, D) flash op, the direct API, AttentionMode ------

from support import attn_reference as ref  # noqa: E402


def _arch_key(kernel):
    return (f"aot:{device.arch_of(torch.cuda.current_device())}", kernel)


@pytest.mark.parametrize("causal,wl,wr,sq,sk", [
    (False, 64, 64, 1024, 1024), (True, 100, None, 777, 1024), (False, 0, 0, 300, 100),
    (True, None, None, 300, 129),
])
def test_flash_attention_forward_op_window_on_gpu(enabled, causal, wl, wr, sq, sk):
    gen = torch.Generator("cuda").manual_seed(7)
    q = torch.randn(2, sq, 4, 128, device="cuda", dtype=torch.float16, generator=gen)
    k = torch.randn(2, sk, 2, 128, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(2, sk, 2, 128, device="cuda", dtype=torch.float16, generator=gen)
    g = torch.randn_like(q)
    out, lse, seed, offset, _ = torch.ops.aten._flash_attention_forward(
        q, k, v, None, None, sq, sk, 0.0, causal, False,
        window_size_left=wl, window_size_right=wr)
    dq, dk, dv = torch.ops.aten._flash_attention_backward(
        g, q, k, v, out, lse, None, None, sq, sk, 0.0, causal, seed, offset,
        window_size_left=wl, window_size_right=wr)
    assert backends.launch_counts()[_arch_key("attn_fwd")] == 1
    assert backends.launch_counts()[_arch_key("attn_bwd_dkdv")] == 1
    window = (-1 if wl is None or wl >= sk else wl, -1 if wr is None or wr >= sk else wr)
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    ref.check_all({"out": t(out), "lse": lse, "dq": t(dq), "dk": t(dk), "dv": t(dv)},
                  t(q), t(k), t(v), t(g), causal=causal, window=window)


def test_flash_attn_func_on_gpu():
    backends.reset_launch_counts()
    q = torch.randn(2, 300, 8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 257, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 257, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(q)
    out = aotriton_rocm.flash_attn_func(q, k, v, causal=True, window_size=(50, -1))
    out.backward(g)
    assert backends.launch_counts()[_arch_key("attn_bwd_dq")] == 1
    t = lambda x: x.detach().transpose(1, 2)  # noqa: E731
    ref.check_all({"out": t(out), "dq": t(q.grad), "dk": t(k.grad), "dv": t(v.grad)},
                  t(q), t(k), t(v), t(g), causal=True, window=(50, -1))


@pytest.mark.parametrize("d,hk,sq,causal", [(64, 4, 1, False), (128, 1, 16, True), (128, 4, 17, False),
                                             (256, 2, 3, True)])
def test_decoding_backward_on_gpu(d, hk, sq, causal):
    """A few query rows against a long context: up to 16 rows dK/dV runs the
    point's decoding tile where the image has one (sm_90's are measured),
    from 17 on its key-length bucket. Gradients against float32 math."""
    gen = torch.Generator("cuda").manual_seed(sq + d)
    q, g = (torch.randn(2, sq, 4, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    k, v = (torch.randn(2, 3001, hk, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    backends.reset_launch_counts()
    out = aotriton_rocm.flash_attn_func(q, k, v, causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), g)
    assert backends.launch_counts()[_arch_key("attn_bwd_dkdv")] == 1
    t = lambda x: x.detach().transpose(1, 2)  # noqa: E731
    ref.check_all({"out": t(out), **{n: t(x) for n, x in zip(("dq", "dk", "dv"), grads)}},
                  t(q), t(k), t(v), t(g), causal=causal)


def test_attention_mode_on_gpu():
    backends.reset_launch_counts()
    q, k, v = (torch.randn(2, 4, 200, 96, device="cuda", dtype=torch.float16) for _ in range(3))
    with aotriton_rocm.AttentionMode() as mode:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(
            200, 200, dtype=torch.bool, device="cuda"))
    # both calls run on our kernels now (a boolean mask is a bias); float64 passes through
    assert backends.launch_counts()[_arch_key("attn_fwd")] == 2
    assert not mode.passed_through
    ref.check_all({"out": out}, q, k, v, causal=True, alignment="top_left")
    ref.check_all({"out": masked}, q, k, v)
    with aotriton_rocm.AttentionMode() as mode:
        F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    assert mode.passed_through


def _same_results(got, want, rng_outputs=(), atol=0.0):
    """Equal layouts; equal values (within atol) except in the RNG-state
    outputs, which may be uninitialised without dropout (the dropout masks
    drawn from them show in the other outputs)."""
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if isinstance(b, torch.Tensor):
            assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
            if i not in rng_outputs:
                torch.testing.assert_close(a, b, atol=atol, rtol=0, msg=f"output {i}")
        else:
            assert a == b


@pytest.mark.parametrize("dropout_p,causal", [(0.0, False), (0.3, True)])
def test_old_torch_fallbacks_equal_torchs_own_kernels(dropout_p, causal):
    """On torch 2.5-2.8 the fallback is the lower-level op torch's SDPA kernel
    calls; here (torch's kernels registered, ours not) it must give torch's
    results, the dropout masks drawn from the same seed included: forwards bit
    for bit, backwards up to the order of torch's atomic adds (its dQ)."""
    aotriton_rocm.disable()
    gen = torch.Generator("cuda").manual_seed(11)
    q, g = (torch.randn(2, 4, 300, 64, device="cuda", generator=gen, dtype=torch.float16)
            for _ in range(2))
    k, v = (torch.randn(2, 4, 257, 64, device="cuda", generator=gen, dtype=torch.float16)
            for _ in range(2))
    # as F.scaled_dot_product_attention hands a mask to the op: rows padded to
    # 16 elements, broadcast dims expanded with stride 0
    bias = torch.randn(2, 1, 300, 272, device="cuda", generator=gen,
                       dtype=torch.float16)[..., :257].expand(2, 4, 300, 257)

    def both(op, subop, *args, rng_outputs=(), atol=0.0):
        torch.manual_seed(5)
        want = op(*args)
        torch.manual_seed(5)
        got = subop(*args)
        _same_results(got, want, rng_outputs, atol)
        return want

    fwd = both(torch.ops.aten._scaled_dot_product_flash_attention,
               torch_integration._flash_by_subop, q, k, v, dropout_p, causal, False,
               rng_outputs=(6, 7))
    both(torch.ops.aten._scaled_dot_product_flash_attention_backward,
         torch_integration._flash_bwd_by_subop, g, q, k, v, fwd[0], fwd[1], *fwd[2:6],
         dropout_p, causal, *fwd[6:8], atol=2e-3)
    fwd = both(torch.ops.aten._scaled_dot_product_efficient_attention,
               torch_integration._efficient_by_subop, q, k, v, bias, True, dropout_p, causal,
               rng_outputs=(2, 3))
    both(torch.ops.aten._scaled_dot_product_efficient_attention_backward,
         torch_integration._efficient_bwd_by_subop, g, q, k, v, bias, fwd[0], fwd[1], fwd[2],
         fwd[3], dropout_p, [True, True, True, True], causal, atol=2e-3)
