"""aotriton_rocm.AttentionMode (TorchFunctionMode route) on CPU tensors: covered
F.scaled_dot_product_attention calls (attn_mask, dropout, fp32, GQA,
torch's causal bias objects) run on our kernels (interpreter backend, launch
counts prove it) and match the math reference (dropout: with the mask of the
independent host Philox model); uncovered calls pass through to torch with
identical results and a counted reason."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

import aotriton_rocm
from support import attn_reference as ref
from support import philox_reference
from aotriton_rocm.core import attention, backends

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


def _nested():
    seqs = [torch.randn(3, 2, 16), torch.randn(5, 2, 16)]
    t = torch.nested.nested_tensor(seqs, layout=torch.jagged).transpose(1, 2)
    return t, t, t


F16 = torch.float16


@pytest.mark.parametrize("make,kw,reason", [
    (lambda: _qkv(8, 8, 1, 1, 16, torch.float64, 0), {}, "dtype"),
    (lambda: _qkv(8, 8, 1, 1, 520, F16, 0), {}, "head_dim 520"),
    (lambda: _qkv(8, 8, 2, 1, 16, F16, 0), {}, "enable_gqa"),
    (lambda: _qkv(8, 8, 3, 2, 16, F16, 0), {"enable_gqa": True}, "multiple of key/value"),
    (lambda: [t[0] for t in _qkv(8, 8, 1, 1, 16, F16, 0)], {}, "4-D"),
    (lambda: _qkv(8, 8, 1, 1, 16, F16, 0), {"attn_mask": torch.zeros(8, 8)}, "neither bool"),
    (lambda: _qkv(8, 8, 1, 1, 16, F16, 0),
     {"attn_mask": torch.ones(8, 8).bool(), "is_causal": True}, "is_causal=True"),
    (lambda: _qkv(8, 8, 1, 1, 16, F16, 0), {"attn_mask": torch.zeros(2, 8, 9).half()},
     "does not broadcast"),
    (lambda: _qkv(8, 8, 1, 1, 16, F16, 0), {"dropout_p": torch.tensor(0.0)},
     "dropout_p must be a Python number"),
    (lambda: _qkv(8, 8, 1, 1, 16, F16, 0), {"dropout_p": 1.0}, "outside [0, 1)"),
    (lambda: _qkv(8, 8, 1, 1, 16, F16, 0), {"attn_mask": causal_upper_left(8, 8),
                                             "is_causal": True}, "CausalBias"),
    (lambda: _qkv(8, 6, 1, 1, 16, F16, 0), {"attn_mask": causal_lower_right(8, 7)},
     "CausalBias whose"),
    (_nested, {}, "nested tensors"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_mode_passes_uncovered_calls_through_untouched(make, kw, reason):
    q, k, v = make()
    torch.manual_seed(5)  # dropout draws the same mask in both calls
    try:
        expected = F.scaled_dot_product_attention(q, k, v, **kw)
    except (RuntimeError, ValueError) as exc:  # torch refuses it: so must the mode, the same way
        expected = exc
    backends.reset_launch_counts()
    torch.manual_seed(5)
    with aotriton_rocm.AttentionMode() as mode:
        if isinstance(expected, Exception):
            with pytest.raises(type(expected)):
                F.scaled_dot_product_attention(q, k, v, **kw)
        else:
            got = F.scaled_dot_product_attention(q, k, v, **kw)
            if got.is_nested:
                got, expected = got.values(), expected.values()
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


def _grads(*tensors):
    return [None if t.grad is None else t.grad.clone() for t in tensors]


# (dtype, D, Sq, Sk, H, Hk, mask shape, mask requires grad)
FLOAT_MASKS = [
    (torch.float16, 32, 21, 26, 2, 2, (2, 1, 21, 26), True),  # broadcast over heads
    (torch.float32, 16, 13, 9, 4, 2, (13, 9), True),          # fp32, GQA, one mask for all
]


@pytest.mark.parametrize("case", FLOAT_MASKS, ids=lambda c: f"{c[0]}-{c[6]}".replace("torch.", ""))
def test_mode_float_attn_mask_and_its_gradient(case):
    dtype, d, sq, sk, h, hk, shape, grad = case
    q, k, v = _qkv(sq, sk, h, hk, d, dtype, sq * sk)
    gen = torch.Generator().manual_seed(1)
    mask = torch.randn(shape, generator=gen).to(dtype).requires_grad_(grad)
    g = torch.randn(2, h, sq, d, generator=gen).to(dtype)
    backends.reset_launch_counts()
    with aotriton_rocm.AttentionMode() as mode:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=h != hk)
    out.backward(g)
    assert not mode.passed_through and backends.launch_counts()[("interpreter:cpu", "attn_fwd")]
    assert mask.grad.shape == mask.shape
    ref.check_all({"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad,
                   "dbias": mask.grad}, q.detach(), k.detach(), v.detach(), g,
                  bias=mask.detach(), alignment="top_left")


def test_mode_bool_mask_with_a_row_that_sees_no_key():
    # torch's math backend (2.13) gives such a row output 0 and zero gradients: so do we.
    q, k, v = _qkv(11, 14, 4, 2, 16, torch.bfloat16, 2)
    gen = torch.Generator().manual_seed(2)
    mask = torch.rand(2, 1, 11, 14, generator=gen) > 0.4
    mask[1, 0, 5] = False
    g = torch.randn(2, 4, 11, 16, generator=gen).to(torch.bfloat16)
    with aotriton_rocm.AttentionMode() as mode:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    out.backward(g)
    assert not mode.passed_through
    ours = [out.detach(), *_grads(q, k, v)]
    for t in (q, k, v):
        t.grad = None
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        math = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    math.backward(g)
    assert torch.equal(ours[0][1, :, 5], math.detach()[1, :, 5])  # zeros
    assert not ours[1][1, :, 5].any()
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    ref.check_all({"out": ours[0], "dq": ours[1], "dk": ours[2], "dv": ours[3]},
                  q.detach(), k.detach(), v.detach(), g, bias=additive, alignment="top_left")


def test_mode_dropout_uses_our_philox_stream_forward_and_backward():
    dtype, sq, sk, h, d, p = torch.float16, 18, 23, 2, 32, 0.3
    q, k, v = _qkv(sq, sk, h, h, d, dtype, 7)
    gen = torch.Generator().manual_seed(7)
    mask = torch.randn(1, h, sq, sk, generator=gen).to(dtype)
    g = torch.randn(2, h, sq, d, generator=gen).to(dtype)
    torch.manual_seed(11)
    with aotriton_rocm.AttentionMode() as mode:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        again = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    assert not mode.passed_through and not torch.equal(out, again)  # a fresh draw per call
    out.backward(g)
    torch.manual_seed(11)  # the state the first call drew from torch's generator
    keep = philox_reference.keep_mask_for(tuple(attention.new_rng_state(q.device)),
                                          (2, h, sq, sk), p)
    assert abs(keep.float().mean().item() - (1 - p)) < 0.05
    ref.check_all({"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad},
                  q.detach(), k.detach(), v.detach(), g, bias=mask, keep=keep, dropout_p=p,
                  alignment="top_left")


@pytest.mark.parametrize("bias,sq,sk", [(causal_lower_right, 7, 19), (causal_lower_right, 19, 7),
                                        (causal_upper_left, 7, 19)])
def test_mode_causal_bias_objects(bias, sq, sk):
    q, k, v = _qkv(sq, sk, 2, 2, 16, torch.float16, sq + 2 * sk)
    g = torch.randn(2, 2, sq, 16).half()
    with pytest.warns(UserWarning) if sq > sk else contextlib.nullcontext():
        attn_bias = bias(sq, sk)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias)  # torch's own
    backends.reset_launch_counts()
    with aotriton_rocm.AttentionMode() as mode:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias)
    assert not mode.passed_through and backends.launch_counts()[("interpreter:cpu", "attn_fwd")]
    torch.testing.assert_close(out, expected, atol=2e-3, rtol=2e-3)
    out.backward(g)
    alignment = "bottom_right" if bias is causal_lower_right else "top_left"
    ref.check_all({"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad},
                  q.detach(), k.detach(), v.detach(), g, causal=True, alignment=alignment)
