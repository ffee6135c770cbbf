"""Dropout draws follow torch's generator, on CPU tensors (the kernel sources
in Triton's interpreter): ``torch.manual_seed(42)`` then the efficient op
draws with (42, 0), so the mask torch's tests regenerate with
``_fill_mem_eff_dropout_mask_(mask, p, 42, 0)`` is the one the op used (its
output and gradients against the math reference with that mask, in
float32/float64); successive calls advance the offset as torch's kernels
advance the CUDA generator; the CPU rule of :mod:`aotriton_rocm.core.philox_state`."""

from __future__ import annotations

import pytest
import torch

import aotriton_rocm
from support import attn_reference as ref
from support import philox_reference
from support.dmask_reference import check_like_torch
from aotriton_rocm.core import philox_state
from aotriton_rocm.integrations import torch_integration as ti

pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")

MATH = torch.ops.aten._scaled_dot_product_attention_math
FUDGE = {"out": 6.0, "dq": 110.0, "dk": 8.0, "dv": 6.0}


def _qkv(b, h, sq, sk, d, dtype, seed=3):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, s, d, generator=gen).to(dtype) for s in (sq, sk, sk))


def _regenerated(shape, p, seed, offset):
    """torch's test helper: the efficient op's mask from seed/offset ints."""
    aotriton_rocm.enable(cpu_interpreter=True)
    try:
        mask = torch.empty(shape, dtype=torch.float32)
        filled = torch.ops.aten._fill_mem_eff_dropout_mask_(mask, p, seed, offset)
    finally:
        aotriton_rocm.disable()
    return (filled > (0.0 if torch.version.hip else p)).to(torch.float32)


@pytest.mark.parametrize("dtype,causal,bias", [(torch.float16, True, False),
                                               (torch.float32, False, True)])
def test_manual_seed_42_then_the_efficient_op_is_what_torchs_test_regenerates(dtype, causal,
                                                                              bias):
    # torch's test_mem_efficient_attention_vs_math_ref_grads (and its
    # attn_mask twin): manual_seed(42), the op, the mask regenerated from
    # (42, 0) -- not from what the op returned -- and the math reference.
    b, h, sq, sk, d, p = 1, 2, 12, 21, 16, 0.3
    q, k, v = _qkv(b, h, sq, sk, d, dtype)
    attn_bias = torch.randn(b, h, sq, sk, generator=torch.Generator().manual_seed(4)).to(dtype) \
        if bias else None
    torch.manual_seed(42)
    out, lse, seed, offset = ti.efficient_attention_forward(q, k, v, attn_bias, True, p, causal)
    assert (seed.item(), offset.item()) == (42, 0)
    mask = _regenerated((b, h, sq, sk), p, 42, 0)
    assert torch.equal(mask.bool(), philox_reference.keep_mask(42, 0, (b, h, sq, sk), p))
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    dq, dk, dv, _ = ti.efficient_attention_backward(grad_out, q, k, v, attn_bias, out, lse, seed,
                                                    offset, p, [True, True, True, False],
                                                    causal)
    results = {}
    for dt in (ref.golden_dtype(dtype), dtype):
        qr, kr, vr = (t.to(dt).requires_grad_(True) for t in (q, k, v))
        o = MATH(qr, kr, vr, None if attn_bias is None else attn_bias.to(dt), dropout_p=p,
                 is_causal=causal, dropout_mask=mask.to(dt))[0]
        results[dt] = (o, *torch.autograd.grad(o, (qr, kr, vr), grad_out.to(dt)))
    golden, lp = results[ref.golden_dtype(dtype)], results[dtype]
    for name, got, g, l in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), golden, lp):
        check_like_torch(got, g.detach(), l.detach(), FUDGE[name])


def test_successive_calls_advance_the_offset_as_torchs_kernels_do():
    b, h, sq, sk, d, p = 1, 1, 3, 5, 16, 0.5  # 15 scores: rounded up to 16
    q, k, v = _qkv(b, h, sq, sk, d, torch.float32)
    torch.manual_seed(7)
    states = [ti.efficient_attention_forward(q, k, v, None, False, p)[2:] for _ in range(2)]
    # A flash op call: 32 * batch * heads; a debug mask at p = 0 draws nothing.
    qf, kf = (t.transpose(1, 2).to(torch.float16) for t in (q, k))
    ti.flash_attention_forward(qf, kf, kf, None, None, sq, sk, 0.0, False, True)
    flash = ti.flash_attention_forward(qf, kf, kf, None, None, sq, sk, p, False, False)
    states.append(ti._rng_inputs(flash[2], flash[3]))
    states.append(ti.efficient_attention_forward(q, k, v, None, False, p)[2:])
    got = [(int(s), int(o)) for s, o in states]
    assert got == [(7, 0), (7, 16), (7, 32), (7, 64)]
    masks = [_regenerated((b, h, sq, sk), p, s, o) for s, o in got[:2]]
    assert not torch.equal(*masks)


def test_flash_attn_func_draws_from_the_generator_too():
    b, h, s, d, p = 1, 2, 9, 16, 0.4
    q, k, v = (t.transpose(1, 2).contiguous() for t in _qkv(b, h, s, s, d, torch.float16))
    for offset in (0, philox_state.round4(b * h * s * s)):  # one counter per score
        if offset == 0:
            torch.manual_seed(13)
        _, _, s_dmask = aotriton_rocm.flash_attn_func(q, k, v, dropout_p=p,
                                                      return_attn_probs=True)
        keep = ~torch.signbit(s_dmask[:, :, :s, :s])
        assert torch.equal(keep, philox_reference.keep_mask(13, offset, (b, h, s, s), p))


def test_cpu_rule():
    dims = philox_state.efficient_dims(2, 3, 5, 7)  # 210 counters: 212
    torch.manual_seed(5)
    assert philox_state.next_state("cpu", dims).tolist() == [5, 0]
    assert philox_state.next_state("cpu", dims).tolist() == [5, 212]
    assert philox_state.next_state("cpu", philox_state.flash_dims(2, 3)).tolist() == [5, 424]
    torch.manual_seed(5)  # a reseed starts over, also with the same seed
    assert philox_state.next_state("cpu", dims).tolist() == [5, 0]
    # Something else drew from the generator: a restart hashed from its
    # state, reproducible, a multiple of 4, then advanced as before.
    runs = []
    for _ in range(2):
        torch.manual_seed(6)
        torch.rand(3)
        runs.append([philox_state.next_state("cpu", dims).tolist() for _ in range(2)])
    assert runs[0] == runs[1]
    (s0, o0), (s1, o1) = runs[0]
    assert s0 == s1 == 6 and o0 % 4 == 0 and 0 < o0 < 2**62 and o1 == o0 + 212


def test_increments_round_up_like_torchs_generator():
    assert [philox_state.round4(n) for n in (0, 1, 4, 5, 15, 16)] == [0, 4, 4, 8, 16, 16]
    assert philox_state.flash_dims(3, 5) == (3, 5, 1, 32)


def test_nearby_offsets_draw_unrelated_masks():
    # torch's flash ops advance the offset by 32 per (batch, head) although
    # our kernels draw one counter per score: the offset is the counter's
    # high half, so the next call's draws are not the last ones shifted.
    from aotriton_rocm.core import dropout_masks
    first, second = (torch.empty(1, 2, 8, 64) for _ in range(2))
    dropout_masks.fill_dropout_uniform(first, 7, 0)
    dropout_masks.fill_dropout_uniform(second, 7, philox_state.round4(32 * 1 * 2))
    assert torch.equal(second, philox_reference.uniform(7, 64, (1, 2, 8, 64)))
    shift = 64
    assert (first.flatten()[shift:] == second.flatten()[:-shift]).float().mean() < 0.01
