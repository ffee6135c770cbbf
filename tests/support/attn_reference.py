"""Explicit masked attention (the math reference) and PyTorch's tolerance
model, shared by the tests of the op overrides, the direct API and the
TorchFunctionMode route. Tensors are (B, H, S, D); k/v may have fewer heads
(GQA: repeated over their query-head groups)."""

from __future__ import annotations

import math

import torch

FUDGE = {"out": 4.0, "lse": 4.0, "dq": 180.0, "dk": 16.0, "dv": 4.0, "dbias": 45.0}
GRAD_FLOOR = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}
GRADS = ("dq", "dk", "dv", "dbias")


def visible(sq: int, sk: int, causal: bool, window=(-1, -1), alignment="bottom_right"):
    """key j visible from query i iff i + shift - left <= j <= i + shift + right."""
    shift = sk - sq if alignment == "bottom_right" else 0
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    vis = torch.ones(sq, sk, dtype=torch.bool)
    if right >= 0:
        vis &= j <= i + shift + right
    if left >= 0:
        vis &= j >= i + shift - left
    return vis


def alibi_bias(slopes, b, h, sq, sk):
    """flash-attn's ALiBi as an explicit (B, H, Sq, Sk) float64 bias:
    ``-slope * |i + sk - sq - j|``; ``slopes`` (H,) or (B, H)."""
    slopes = slopes.detach().double().cpu().expand(b, h)
    i = torch.arange(sq, dtype=torch.float64)[:, None]
    j = torch.arange(sk, dtype=torch.float64)[None, :]
    return -slopes[:, :, None, None] * (i + sk - sq - j).abs()


def attention(q, k, v, grad_out=None, *, scale=None, causal=False, window=(-1, -1),
              alignment="bottom_right", dtype=torch.float32, bias=None, keep=None,
              dropout_p=0.0, softcap=0.0, alibi_slopes=None):
    """out, lse and (with grad_out) dq, dk, dv (and dbias) computed in `dtype`;
    rows that see no key: output 0, lse +inf. ``bias``: additive (B, H, Sq, Sk)
    broadcastable; ``keep``: the dropout mask (kept entries scaled by 1 / (1 -
    dropout_p)); ``softcap`` > 0: scores -> softcap * tanh(scores / softcap)
    (torch.tanh, differentiated by autograd); ``alibi_slopes``: an explicit
    :func:`alibi_bias` added after it (no gradient)."""
    q, k, v = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kr, vr = (t.repeat_interleave(group, dim=1) for t in (k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.matmul(q, kr.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes, *s.shape).to(dtype).to(s.device)
    if bias is not None:
        bias = bias.detach().to(dtype).requires_grad_(True)
        s = s + bias
    vis = visible(s.shape[-2], s.shape[-1], causal, window, alignment).to(s.device)
    vis = vis & (s.detach() > float("-inf"))  # a -inf bias hides a key too
    s = s.masked_fill(~vis, float("-inf"))
    rows = vis.any(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(~rows, 0.0), dim=-1) * rows
    if keep is not None:
        p = p * keep.to(p.device) / (1.0 - dropout_p)
    out = torch.matmul(p.to(dtype), vr)
    lse = torch.logsumexp(s.detach().float(), dim=-1).masked_fill(~rows[..., 0], float("inf"))
    res = {"out": out.detach(), "lse": lse}
    if grad_out is not None:
        out.backward(grad_out.to(dtype))
        res.update(dq=q.grad, dk=k.grad, dv=v.grad)
        if bias is not None:
            res["dbias"] = bias.grad
    return res


def check(name, test, golden, lp_ref, dtype, guard=None):
    """PyTorch's rule: max|golden - test| <= max(floor, fudge * max|golden - lp_ref|).

    ``guard``, if given, also bounds the error by ``guard * max|golden - lp_ref|``
    (tighter than PyTorch's fudge factors, which would let e.g. a dropped key
    block through dq). Returns (err, ref_err).
    """
    test, golden, lp_ref = test.double(), golden.double(), lp_ref.double()
    assert test.shape == golden.shape, (name, test.shape, golden.shape)
    assert not torch.isnan(test).any(), f"{name}: NaN (unwritten or invalid elements)"
    # lse is +inf on rows that see no key: those must match exactly.
    inf = torch.isinf(golden)
    assert torch.equal(test[inf], golden[inf]) and not torch.isinf(test[~inf]).any(), \
        f"{name}: infinities differ"
    test, golden, lp_ref = test[~inf], golden[~inf], lp_ref[~inf]
    if golden.numel() == 0:
        return 0.0, 0.0
    err = (golden - test).abs().max().item()
    ref_err = (golden - lp_ref).abs().max().item()
    floor = 1e-5
    if name in GRADS:
        floor = max(floor, GRAD_FLOOR[dtype] * max(1.0, golden.abs().max().item()) / 8)
    tol = max(floor, FUDGE[name] * ref_err)
    assert err <= tol, f"{name}: max err {err:.3e} > tol {tol:.3e} (lp ref err {ref_err:.3e})"
    if guard is not None:
        bound = max(floor, guard * ref_err)
        assert err <= bound, (f"{name}: max err {err:.3e} > {guard} x low-precision ref err "
                              f"{ref_err:.3e}")
    return err, ref_err


def golden_dtype(dtype: torch.dtype) -> torch.dtype:
    """PyTorch's golden: float32 math for fp16/bf16 inputs, float64 for fp32."""
    return torch.float64 if dtype == torch.float32 else torch.float32


def check_all(results: dict, q, k, v, grad_out=None, **mask):
    """Judge `results` (names as in :func:`attention`) against the reference."""
    golden = attention(q, k, v, grad_out, dtype=golden_dtype(q.dtype), **mask)
    lp = attention(q, k, v, grad_out, dtype=q.dtype, **mask)
    for name, value in results.items():
        check(name, value, golden[name], lp[name], q.dtype)
