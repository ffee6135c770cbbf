"""Dropout masks as other code reads them, on CPU tensors (the kernel sources
in Triton's interpreter), against independent references: flash-attn's
S_dmask normalised the way flash-attn's tests normalise it (re-implemented
here from the documented convention) against softmax probabilities in
float64, its sign against the numpy Philox model (tests/support/philox_reference.py)
and the output recomputed from that mask; the varlen S_dmask per sequence;
the draws behind torch's ``_fill_mem_eff_dropout_mask_`` against the numpy
model, and the mask torch regenerates after our efficient op against the
output that op returned."""

from __future__ import annotations

import math

import pytest
import torch

import aotriton_rocm
from support import attn_reference as ref
from support.dmask_reference import (check_like_torch, normalise_like_flash_attn, round128,
                             softmax_reference)
from support import philox_reference
from aotriton_rocm.core import attention, dropout_masks
from aotriton_rocm.integrations import aten_ops, torch_integration as ti

pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")


def test_block_n_follows_flash_attns_table_with_dropout():
    # flash-attn's _get_block_size_n(..., is_dropout=True): 128 up to head dim
    # 32, 64 up to 96, 32 up to 128, 64 up to 256 (every arch agrees with dropout).
    got = {d: dropout_masks.s_dmask_block_n(d) for d in (8, 32, 40, 64, 72, 96, 104, 128, 136,
                                                         192, 256, 512)}
    assert got == {8: 128, 32: 128, 40: 64, 64: 64, 72: 64, 96: 64, 104: 32, 128: 32, 136: 64,
                   192: 64, 256: 64, 512: 64}


# (dtype, D, Sq, Sk, H, Hk, causal, window, softmax_scale, dropout_p)
DENSE = [
    (torch.float16, 64, 70, 150, 2, 2, True, (-1, -1), None, 0.3),    # N = 64, 3 key blocks
    (torch.bfloat16, 104, 33, 97, 4, 2, False, (20, 5), None, 0.2),   # N = 32, GQA, window
    (torch.float32, 24, 40, 300, 2, 1, False, (-1, -1), 0.15, 0.45),  # N = 128, MQA, scale
]


@pytest.mark.parametrize("case", DENSE, ids=lambda c: f"{c[0]}-d{c[1]}".replace("torch.", ""))
def test_flash_attn_func_s_dmask_normalises_to_the_probabilities(case):
    dtype, d, sq, sk, h, hk, causal, window, scale, p = case
    gen = torch.Generator().manual_seed(d + sq)
    q = (torch.randn(2, sq, h, d, generator=gen) * 1.5).to(dtype)
    k = (torch.randn(2, sk, hk, d, generator=gen) * 1.5).to(dtype)
    v = torch.randn(2, sk, hk, d, generator=gen).to(dtype)
    torch.manual_seed(31)
    out, lse, s_dmask = aotriton_rocm.flash_attn_func(q, k, v, dropout_p=p, softmax_scale=scale,
                                                      causal=causal, window_size=window,
                                                      return_attn_probs=True)
    assert s_dmask.shape == (2, h, round128(sq), round128(sk)) and s_dmask.dtype == dtype
    # Padding rows/columns and keys a row does not see hold 0.
    assert not s_dmask[:, :, sq:].any() and not s_dmask[..., sk:].any()
    vis = ref.visible(sq, sk, causal, window)
    assert not s_dmask[:, :, :sq, :sk][..., ~vis].any()
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    sc = 1 / math.sqrt(d) if scale is None else scale
    probs, keep = normalise_like_flash_attn(s_dmask, t(q), t(k), sc, vis,
                                            dropout_masks.s_dmask_block_n(d))
    want = softmax_reference(t(q), t(k), sc, vis)
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}[dtype]
    assert (probs - want).abs().max().item() <= tol * max(1.0, want.abs().max().item())
    # The sign is the kernel's keep mask: the independent Philox model ...
    torch.manual_seed(31)
    rng = tuple(attention.new_rng_state(torch.device("cpu")))
    model = philox_reference.keep_mask_for(rng, (2, h, sq, sk), p)
    dropped = torch.signbit(s_dmask[:, :, :sq, :sk])
    assert torch.equal(~dropped[..., vis], model[..., vis])
    assert torch.equal(keep[..., vis] | (s_dmask[:, :, :sq, :sk] == 0)[..., vis],
                       model[..., vis] | (s_dmask[:, :, :sq, :sk] == 0)[..., vis])
    # ... and the mask the output was computed with.
    ref.check_all({"out": t(out), "lse": lse}, t(q), t(k), t(v), scale=scale, causal=causal,
                  window=window, keep=~dropped, dropout_p=p)


def test_s_dmask_of_rows_that_see_no_key_and_without_dropout():
    q, k, v = (torch.randn(1, s, 2, 16).half() for s in (40, 9, 9))
    out, lse, s_dmask = aotriton_rocm.flash_attn_func(q, k, v, dropout_p=0.5, causal=True,
                                                      return_attn_probs=True)
    # Bottom-right causal with Sq > Sk: the first 31 rows see no key.
    assert not s_dmask[:, :, :31].any() and s_dmask[:, :, 31:40, :9].abs().gt(0).any()
    assert not out[:, :31].any() and torch.isinf(lse[..., :31]).all()
    # Without dropout flash-attn 2.8 returns an empty (0,) tensor as S_dmask.
    _, _, none = aotriton_rocm.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert none.shape == (0,) and none.dtype == q.dtype


def _packed(lens, h, d, dtype, gen):
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return cu, (torch.randn(sum(lens), h, d, generator=gen) * 1.5).to(dtype)


@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (7, 2))])
def test_flash_attn_varlen_func_s_dmask_per_sequence(causal, window):
    dtype, d, h, hk, p = torch.float16, 40, 2, 1, 0.25
    lens_q, lens_k = [30, 0, 9, 140], [50, 6, 9, 70]
    gen = torch.Generator().manual_seed(5 + int(causal))
    cu_q, q = _packed(lens_q, h, d, dtype, gen)
    cu_k, k = _packed(lens_k, hk, d, dtype, gen)
    v = torch.randn(k.shape, generator=gen).to(dtype)
    max_q, max_k = max(lens_q), max(lens_k)
    torch.manual_seed(8)
    out, lse, s_dmask = aotriton_rocm.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=p, causal=causal, window_size=window,
        return_attn_probs=True)
    assert s_dmask.shape == (4, h, round128(max_q), round128(max_k))
    torch.manual_seed(8)
    rng = tuple(attention.new_rng_state(torch.device("cpu")))
    model = philox_reference.keep_mask_for(rng, (4, h, max_q, max_k), p)
    block_n = dropout_masks.s_dmask_block_n(d)
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        # Sequence b sits at the top left of [b]; everything else is 0.
        seq = s_dmask[b:b + 1]
        assert not seq[:, :, lq:].any() and not seq[..., lk:].any()
        if lq == 0:
            continue
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        qb, kb, vb = (t[r].transpose(0, 1).unsqueeze(0) for t, r in ((q, rq), (k, rk), (v, rk)))
        vis = ref.visible(lq, lk, causal, window)
        assert not seq[:, :, :lq, :lk][..., ~vis].any()
        probs, _ = normalise_like_flash_attn(seq, qb, kb, 1 / math.sqrt(d), vis, block_n)
        want = softmax_reference(qb, kb, 1 / math.sqrt(d), vis)
        assert (probs - want).abs().max().item() <= 2e-3
        dropped = torch.signbit(seq[:, :, :lq, :lk])
        assert torch.equal(~dropped[..., vis], model[b:b + 1, :, :lq, :lk][..., vis])
        ref.check_all({"out": out[rq].transpose(0, 1).unsqueeze(0),
                       "lse": lse[:, rq].unsqueeze(0)}, qb, kb, vb, causal=causal,
                      window=window, keep=~dropped, dropout_p=p)


def test_fill_dropout_uniform_matches_the_philox_model():
    seed, offset = 0x1234_5678_9ABC, 2**40 - 77  # both 64-bit words in play
    out = torch.empty(2, 3, 21, 70)
    dropout_masks.fill_dropout_uniform(out, seed, offset)
    want = philox_reference.uniform(seed, offset, (2, 3, 21, 70))
    assert torch.equal(out, want)
    assert 0.0 < out.min().item() and out.max().item() <= 1.0
    enc = torch.empty_like(out)
    dropout_masks.fill_dropout_uniform(enc, torch.tensor(seed), torch.tensor(offset),
                                       dropout_p=0.3, encode_keep=True)
    assert torch.equal(enc, torch.where(want > 0.3, 0.5, -0.5))
    with pytest.raises(ValueError, match="contiguous float32"):
        dropout_masks.fill_dropout_uniform(out.transpose(2, 3), seed, offset)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fill_mem_eff_dropout_mask_regenerates_our_efficient_ops_mask(dtype):
    # As torch's tests do: the efficient op's philox seed/offset as ints, the
    # mask regenerated by aten::_fill_mem_eff_dropout_mask_ and read as
    # ``u > p`` (CUDA builds; ROCm builds read 0.5/-0.5 as ``> 0``), the
    # output checked against the math reference with that mask.
    b, h, sq, sk, d, p = 2, 3, 19, 45, 32, 0.3
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(b, h, s, d, generator=gen).to(dtype) for s in (sq, sk, sk))
    torch.manual_seed(11)  # the op draws its Philox state from torch's generator
    out, lse, seed, offset = ti.efficient_attention_forward(q, k, v, None, True, p, True)
    assert seed.dtype == offset.dtype == torch.int64 and seed.dim() == offset.dim() == 0
    aotriton_rocm.enable(cpu_interpreter=True)
    try:
        mask = torch.empty((b, h, sq, sk), dtype=torch.float32)
        filled = torch._fill_mem_eff_dropout_mask_(mask, p, seed.item(), offset.item())
    finally:
        aotriton_rocm.disable()
    assert filled is mask
    keep = mask > (0.0 if torch.version.hip else p)
    model = philox_reference.keep_mask(seed.item(), offset.item(), (b, h, sq, sk), p)
    assert torch.equal(keep, model)
    ref.check_all({"out": out}, q, k, v, causal=True, alignment="top_left", keep=keep,
                  dropout_p=p)
    # torch's own reference path (its test): the math op with that dropout
    # mask in float32 (float64 for fp32) and in the input dtype, judged by
    # torch's rule.
    math_op = torch.ops.aten._scaled_dot_product_attention_math
    golden, lp = (math_op(*(t.to(dt) for t in (q, k, v)), dropout_p=p, is_causal=True,
                          dropout_mask=keep.float())[0]
                  for dt in (ref.golden_dtype(dtype), dtype))
    check_like_torch(out, golden, lp, fudge=6.0 if torch.version.hip else 3.0)


def test_fill_mem_eff_dropout_mask_is_ours_only_while_enabled():
    mask = torch.empty(1, 1, 4, 8)
    aotriton_rocm.enable(cpu_interpreter=True)
    try:
        torch._fill_mem_eff_dropout_mask_(mask, 0.5, 7, 11)
    finally:
        aotriton_rocm.disable()
    assert torch.equal(mask, philox_reference.uniform(7, 11, (1, 1, 4, 8)))
    with pytest.raises(NotImplementedError):  # torch has no CPU kernel of its own
        torch._fill_mem_eff_dropout_mask_(mask, 0.5, 7, 11)


def test_fill_mem_eff_dropout_mask_leaves_torchs_own_draws_to_torch(monkeypatch):
    # A (seed, offset) that torch's efficient kernel returned (our override
    # fell back to it) is torch's to regenerate; on the CPU, where torch has
    # no kernel of its own, that is an error naming the reason.
    monkeypatch.setattr(aten_ops, "_TORCH_PHILOX", type(aten_ops._TORCH_PHILOX)())
    aten_ops._note_torch_philox(torch.tensor(42), torch.tensor(1024))
    aten_ops._note_torch_philox(torch.tensor(1, device="meta"), torch.tensor(2, device="meta"))
    assert list(aten_ops._TORCH_PHILOX) == [(42, 1024)]  # device scalars are not read
    mask = torch.empty(1, 1, 4, 8)
    aotriton_rocm.enable(cpu_interpreter=True)
    try:
        with pytest.raises(RuntimeError, match="torch's kernel drew this mask"):
            torch._fill_mem_eff_dropout_mask_(mask, 0.5, 42, 1024)
        torch._fill_mem_eff_dropout_mask_(mask, 0.5, 42, 1025)  # ours
    finally:
        aotriton_rocm.disable()
    assert torch.equal(mask, philox_reference.uniform(42, 1025, (1, 1, 4, 8)))


def test_flash_attention_forward_debug_mask_of_a_packed_batch():
    # torch's _flash_attention_forward with cum_seq_q/k and return_debug_mask:
    # (batch, heads, max_q, max_k), sequence b at the top left of [b], its
    # sign the kernel's keep mask (the host Philox model's).
    lens_q, lens_k, h, d, p = [7, 12], [9, 4], 2, 16, 0.4
    gen = torch.Generator().manual_seed(2)
    cu_q, q = _packed(lens_q, h, d, torch.float16, gen)
    cu_k, k = _packed(lens_k, h, d, torch.float16, gen)
    out, lse, seed, offset, debug = ti.flash_attention_forward(
        q, k, k, cu_q, cu_k, 12, 9, p, False, True)
    assert debug.shape == (2, h, 12, 9)
    model = philox_reference.keep_mask_for(ti._rng_inputs(seed, offset), (2, h, 12, 9), p)
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        assert torch.equal(~torch.signbit(debug[b, :, :lq, :lk]), model[b, :, :lq, :lk])
        assert not debug[b, :, lq:].any() and not debug[b, :, :, lk:].any()
