"""aotriton_rocm.AttentionMode (TorchFunctionMode route) on CPU tensors: covered
F.scaled_dot_product_attention calls run on our kernels (interpreter backend,
launch counts prove it) and match the math reference; uncovered calls pass
through to torch with identical results."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import aotriton_rocm
import attn_reference as ref
from aotriton_rocm import backends

pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")


def _qkv(sq, sk, h, hk, d, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, n, s, d, generator=gen).to(dtype).requires_grad_(True)
            for n, s in ((h, sq), (hk, sk), (hk, sk))]


@pytest.mark.parametrize("case", [
    (torch.float16, 64, 33, 33, 2, 2, False, {}),
    (torch.bfloat16, 72, 17, 40, 2, 2, True, {"scale": 0.3}),
    (torch.float16, 64, 40, 17, 4, 2, True, {"enable_gqa": True}),  # top-left, GQA
], ids=str)
def test_mode_computes_covered_sdpa_on_our_kernels(case):
    dtype, d, sq, sk, h, hk, causal, kw = case
    q, k, v = _qkv(sq, sk, h, hk, d, dtype, sq + sk)
    g = torch.randn(2, h, sq, d).to(dtype)
    backends.reset_launch_counts()
    with aotriton_rocm.AttentionMode() as mode:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)
    out.backward(g)
    counts = backends.launch_counts()
    assert counts[("interpreter:cpu", "attn_fwd")] == 1
    assert counts[("interpreter:cpu", "attn_bwd_dq")] == 1
    assert not mode.passed_through
    ref.check_all({"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad},
                  q.detach(), k.detach(), v.detach(), g, scale=kw.get("scale"), causal=causal,
                  alignment="top_left")


@pytest.mark.parametrize("make,kw,reason", [
    (lambda: _qkv(8, 8, 1, 1, 16, torch.float64, 0), {}, "dtype"),
    (lambda: _qkv(8, 8, 1, 1, 16, torch.float16, 0), {"attn_mask": torch.ones(8, 8).bool()},
     "attn_mask"),
    (lambda: _qkv(8, 8, 1, 1, 16, torch.float16, 0), {"dropout_p": 0.3}, "dropout"),
    (lambda: _qkv(8, 8, 1, 1, 12, torch.float16, 0), {}, "head_dim 12"),
    (lambda: _qkv(8, 8, 2, 1, 16, torch.float16, 0), {}, "enable_gqa"),
    (lambda: [t[0] for t in _qkv(8, 8, 1, 1, 16, torch.float16, 0)], {}, "4-D"),
])
def test_mode_passes_uncovered_calls_through_untouched(make, kw, reason):
    q, k, v = make()
    torch.manual_seed(5)  # dropout draws the same mask in both calls
    try:
        expected = F.scaled_dot_product_attention(q, k, v, **kw)
    except RuntimeError as exc:  # torch refuses it: so must the mode, the same way
        expected = exc
    backends.reset_launch_counts()
    torch.manual_seed(5)
    with aotriton_rocm.AttentionMode() as mode:
        if isinstance(expected, Exception):
            with pytest.raises(type(expected)):
                F.scaled_dot_product_attention(q, k, v, **kw)
        else:
            got = F.scaled_dot_product_attention(q, k, v, **kw)
            assert torch.equal(got, expected)
    assert not backends.launch_counts()
    assert any(reason in r for r in mode.passed_through), mode.passed_through


def test_mode_leaves_other_functions_and_ends_with_the_block():
    q, k, v = _qkv(8, 8, 1, 1, 16, torch.float16, 1)
    with aotriton_rocm.AttentionMode():
        y = torch.matmul(q, k.transpose(-1, -2))
    assert torch.equal(y, torch.matmul(q, k.transpose(-1, -2)))
    backends.reset_launch_counts()
    F.scaled_dot_product_attention(q, k, v)
    assert not backends.launch_counts()
