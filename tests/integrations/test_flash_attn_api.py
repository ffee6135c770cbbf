"""aotriton_rocm.flash_attn_func / flash_attn_varlen_func (flash-attn's direct
API) on CPU tensors (kernel sources in Triton's interpreter), against the
explicit masked math reference, gradients through autograd included; dropout
against the independent host model of the Philox mask and the returned
S_dmask; packed batches against per-sequence references; refusals."""

from __future__ import annotations

import pytest
import torch

import aotriton_rocm
from support import attn_reference as ref
from support import philox_reference
from aotriton_rocm.core import attention, backends

pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")


# (dtype, D, Sq, Sk, H, Hk, causal, window, softmax_scale)
CASES = [
    (torch.float16, 64, 33, 33, 2, 2, False, (-1, -1), None),
    (torch.bfloat16, 64, 17, 40, 4, 2, True, (-1, -1), 0.3),
    (torch.float16, 72, 40, 17, 3, 1, True, (-1, -1), None),  # MQA, rows with no key
    (torch.bfloat16, 32, 70, 70, 2, 2, False, (6, 2), None),
    (torch.float16, 40, 33, 47, 2, 1, True, (9, -1), 0.2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)).replace("torch.", ""))
def test_flash_attn_func_matches_math(case):
    dtype, d, sq, sk, h, hk, causal, window, scale = case
    gen = torch.Generator().manual_seed(sq + 7 * sk + d)
    q = torch.randn(2, sq, h, d, generator=gen).to(dtype).requires_grad_(True)
    k = torch.randn(2, sk, hk, d, generator=gen).to(dtype).requires_grad_(True)
    v = torch.randn(2, sk, hk, d, generator=gen).to(dtype).requires_grad_(True)
    g = torch.randn(2, sq, h, d, generator=gen).to(dtype)
    backends.reset_launch_counts()
    out = aotriton_rocm.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal,
                                        window_size=window)
    assert out.shape == q.shape and out.dtype == dtype
    out.backward(g)
    counts = backends.launch_counts()
    assert counts[("interpreter:cpu", "attn_fwd")] == 1
    assert counts[("interpreter:cpu", "attn_bwd_dkdv")] == 1
    t = lambda x: x.detach().transpose(1, 2)  # noqa: E731
    ref.check_all({"out": t(out), "dq": t(q.grad), "dk": t(k.grad), "dv": t(v.grad)},
                  t(q), t(k), t(v), t(g), scale=scale, causal=causal, window=window)


def test_flash_attn_func_without_grad():
    q = torch.randn(1, 9, 2, 16).half()
    out = aotriton_rocm.flash_attn_func(q, q, q, causal=True)
    assert not out.requires_grad
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    ref.check_all({"out": t(out)}, t(q), t(q), t(q), causal=True)


@pytest.mark.parametrize("q,k,match", [
    (torch.randn(1, 8, 1, 16).double(), torch.randn(1, 8, 1, 16).double(), "dtype"),
    (torch.randn(1, 8, 3, 16).half(), torch.randn(1, 8, 2, 16).half(), "multiple of key/value"),
    (torch.randn(8, 1, 16).half(), torch.randn(8, 1, 16).half(), "4-D"),
    (torch.randn(1, 8, 1, 520).half(), torch.randn(1, 8, 1, 520).half(), "head_dim 520"),
])
def test_flash_attn_func_says_why_not(q, k, match):
    with pytest.raises(ValueError, match=match):
        aotriton_rocm.flash_attn_func(q, k, k)


def _bshd(b, sq, sk, h, hk, d, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, g = (torch.randn(b, s, n, d, generator=gen).to(dtype)
                  for s, n in ((sq, h), (sk, hk), (sk, hk), (sq, h)))
    return q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True), g


def _drawn_state(seed):
    """The Philox state a call made right after torch.manual_seed(seed) draws."""
    torch.manual_seed(seed)
    return tuple(attention.new_rng_state(torch.device("cpu")))


# (dtype, D, Sq, Sk, H, Hk, causal, window, dropout_p)
DROPOUT_CASES = [
    (torch.float16, 32, 19, 27, 4, 2, True, (-1, -1), 0.3),  # GQA, bottom-right causal
    (torch.float32, 16, 24, 24, 2, 2, False, (5, 3), 0.48),  # fp32, sliding window
]


@pytest.mark.parametrize("case", DROPOUT_CASES, ids=lambda c: f"{c[0]}-p{c[-1]}".replace("torch.", ""))
def test_flash_attn_func_dropout_and_attn_probs(case):
    dtype, d, sq, sk, h, hk, causal, window, p = case
    q, k, v, g = _bshd(2, sq, sk, h, hk, d, dtype, seed=sq * sk)
    torch.manual_seed(17)
    out, lse, dmask = aotriton_rocm.flash_attn_func(q, k, v, dropout_p=p, causal=causal,
                                                    window_size=window, return_attn_probs=True)
    # flash-attn's layout: rows and columns padded to multiples of 128 (with 0).
    assert dmask.shape == (2, h, 128, 128) and dmask.dtype == dtype and lse.dtype == torch.float32
    assert not dmask[:, :, sq:].any() and not dmask[..., sk:].any()
    dmask = dmask[:, :, :sq, :sk]
    assert not lse.requires_grad and not dmask.requires_grad
    keep = philox_reference.keep_mask_for(_drawn_state(17), (2, h, sq, sk), p)
    vis = ref.visible(sq, sk, causal, window)
    kept = keep[..., vis].float().mean().item()
    assert abs(kept - (1 - p)) < 0.08, kept
    # S_dmask: its sign is the keep mask where a key is visible; hidden keys hold 0.
    assert torch.equal((dmask >= 0)[..., vis], keep[..., vis])
    assert torch.all(dmask[..., ~vis] == 0)
    out.backward(g)  # the backward regenerates the same mask from the saved state
    t = lambda x: x.detach().transpose(1, 2)  # noqa: E731
    ref.check_all({"out": t(out), "lse": lse, "dq": t(q.grad), "dk": t(k.grad), "dv": t(v.grad)},
                  t(q), t(k), t(v), t(g), causal=causal, window=window, keep=keep, dropout_p=p)


def test_flash_attn_func_dropout_follows_torch_seed_and_lse_without_dropout():
    q, k, v, _ = _bshd(1, 9, 11, 2, 2, 16, torch.float16, seed=4)
    torch.manual_seed(3)
    first = aotriton_rocm.flash_attn_func(q, k, v, dropout_p=0.4)
    torch.manual_seed(3)
    again = aotriton_rocm.flash_attn_func(q, k, v, dropout_p=0.4)
    other = aotriton_rocm.flash_attn_func(q, k, v, dropout_p=0.4)
    assert torch.equal(first, again) and not torch.equal(first, other)
    # Without dropout flash-attn 2.8 returns an empty S_dmask; softmax_lse is (B, H, Sq).
    out, lse, dmask = aotriton_rocm.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert dmask.shape == (0,) and lse.shape == (1, 2, 9)
    t = lambda x: x.detach().transpose(1, 2)  # noqa: E731
    ref.check_all({"out": t(out), "lse": lse}, t(q), t(k), t(v), causal=True)


def _packed(lens, h, d, dtype, gen):
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return cu, torch.randn(sum(lens), h, d, generator=gen).to(dtype)


# (dtype, lens_q, lens_k, H, Hk, causal, window, dropout_p, trailing rows past the last offset)
VARLEN_CASES = [
    (torch.float16, [5, 13, 0, 9], [7, 6, 4, 9], 4, 2, True, (-1, -1), 0.0, 3),
    (torch.bfloat16, [11, 1, 6], [4, 12, 6], 2, 1, False, (2, 1), 0.25, 0),
]


@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: f"{c[0]}-p{c[7]}".replace("torch.", ""))
def test_flash_attn_varlen_func_matches_per_sequence_references(case):
    dtype, lens_q, lens_k, h, hk, causal, window, p, tail = case
    d = 16
    gen = torch.Generator().manual_seed(len(lens_q) + tail)
    cu_q, q = _packed(lens_q + [tail], h, d, dtype, gen)
    cu_k, k = _packed(lens_k + [tail], hk, d, dtype, gen)
    v = torch.randn(k.shape, generator=gen).to(dtype)
    cu_q, cu_k = cu_q[:-1].contiguous(), cu_k[:-1].contiguous()  # the tail is in no sequence
    g = torch.randn(q.shape, generator=gen).to(dtype)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    max_q, max_k = max(lens_q), max(lens_k)
    torch.manual_seed(23)
    res = aotriton_rocm.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=p, causal=causal, window_size=window,
        return_attn_probs=not p)
    out, lse, dmask = res if not p else (res, None, None)
    assert out.shape == q.shape and (dmask is None or dmask.shape == (0,))
    assert p or lse.shape == (h, q.shape[0]) and torch.isinf(lse[:, sum(lens_q):]).all()
    out.backward(g)
    keep = None
    if p:  # element (b, h, i, j) of the (B, H, max_seqlen_q, max_seqlen_k) Philox stream
        keep = philox_reference.keep_mask_for(_drawn_state(23), (len(lens_q), h, max_q, max_k), p)
    for i in range(len(lens_q)):
        rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rk = slice(int(cu_k[i]), int(cu_k[i + 1]))

        def seq(t, rows):
            return t.detach()[rows].transpose(0, 1).unsqueeze(0)

        if rq.start == rq.stop:  # no queries: nothing flows to this sequence's keys
            assert not k.grad[rk].any() and not v.grad[rk].any()
            continue
        mask = dict(causal=causal, window=window)
        if p:
            mask.update(keep=keep[i:i + 1, :, :lens_q[i], :lens_k[i]], dropout_p=p)
        got = {"out": seq(out, rq), "dq": seq(q.grad, rq), "dk": seq(k.grad, rk),
               "dv": seq(v.grad, rk)}
        if not p:
            got["lse"] = lse[:, rq].unsqueeze(0)
        ref.check_all(got, seq(q, rq), seq(k, rk), seq(v, rk), seq(g, rq), **mask)
    if tail:  # rows past the last offset: output 0, gradients 0
        assert not out[-tail:].any() and not q.grad[-tail:].any()
        assert not k.grad[-tail:].any() and not v.grad[-tail:].any()


def _varlen_args(**over):
    q = torch.randn(10, 2, 16).half()
    args = dict(q=q, k=q, v=q, cu_seqlens_q=torch.tensor([0, 4, 10], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, 4, 10], dtype=torch.int32), max_seqlen_q=6,
                max_seqlen_k=6)
    args.update(over)
    return args


@pytest.mark.parametrize("over,match", [
    (dict(cu_seqlens_q=torch.tensor([0, 4, 10])), "int32"),
    (dict(cu_seqlens_q=torch.tensor([1, 4, 10], dtype=torch.int32)), "start at 0"),
    (dict(cu_seqlens_k=torch.tensor([0, 7, 6], dtype=torch.int32)), "non-decreasing"),
    (dict(cu_seqlens_k=torch.tensor([0, 4, 11], dtype=torch.int32)), "beyond the 10"),
    (dict(max_seqlen_q=5), "exceeds max_seqlen_q=5"),
    (dict(cu_seqlens_k=torch.tensor([0, 10], dtype=torch.int32)), "same length"),
    (dict(q=torch.randn(1, 10, 2, 16).half()), "3-D packed"),
    (dict(block_table=torch.zeros(1, 1, dtype=torch.int32)), "block_table"),
    (dict(dropout_p=1.0), r"outside \[0, 1\)"),
])
def test_flash_attn_varlen_func_says_why_not(over, match):
    with pytest.raises(ValueError, match=match) as info:
        aotriton_rocm.flash_attn_varlen_func(**_varlen_args(**over))
    assert "supported:" in str(info.value)


@pytest.mark.parametrize("kwargs,match", [
    (dict(softcap=-1.0), "softcap=-1: must be finite and >= 0"),
    (dict(softcap="big"), "softcap must be a float"),
    (dict(alibi_slopes=torch.ones(1, dtype=torch.float64)), "alibi_slopes must be fp32"),
    (dict(alibi_slopes=torch.ones(2)), r"alibi_slopes must be \(heads,\)"),
    (dict(window_size=3), "window_size must be a pair"),
    (dict(window_size=(1.5, 2)), r"window_size must be a pair of ints .*got \(1\.5, 2\)"),
    (dict(window_size=(4, 2.0)), "window_size must be a pair of ints"),
    (dict(dropout_p=-0.1), "dropout_p=-0.1"),
])
def test_flash_attn_func_refuses_what_it_does_not_support(kwargs, match):
    q = torch.randn(1, 8, 1, 16).half()
    with pytest.raises(ValueError, match=match):
        aotriton_rocm.flash_attn_func(q, q, q, **kwargs)
