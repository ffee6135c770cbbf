"""aten::_flash_attention_forward / _flash_attention_backward overrides
((B, S, H, D), bottom-right causal, sliding window). These ops have no CPU
kernel, so the op functions the CUDA-key overrides call are run directly on
CPU tensors (interpreter backend), against the explicit masked math
reference; outputs are checked against torch's meta kernel."""

from __future__ import annotations

import pytest
import torch

from support import attn_reference as ref
from aotriton_rocm.core import backends
from aotriton_rocm.integrations import torch_integration as ti

pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")

FA = torch.ops.aten._flash_attention_forward.default
FA_BWD = torch.ops.aten._flash_attention_backward.default


def _bshd(b, s, h, d, dtype, gen):
    return torch.randn(b, s, h, d, generator=gen).to(dtype)


def _meta(t):
    return t.to("meta")


# (dtype, D, Sq, Sk, H, Hk, is_causal, window_left, window_right)
CASES = [
    (torch.float16, 64, 33, 33, 2, 2, False, None, None),
    (torch.bfloat16, 64, 17, 40, 2, 2, True, None, None),
    (torch.float16, 72, 40, 17, 2, 2, True, None, None),  # rows with no key
    (torch.float16, 64, 70, 70, 2, 2, False, 8, 8),
    (torch.bfloat16, 40, 33, 47, 4, 2, True, 6, None),
    (torch.float16, 64, 40, 10, 2, 1, False, 0, 0),  # window leaves rows empty
    (torch.float16, 32, 20, 20, 2, 2, False, -1, 3),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)).replace("torch.", ""))
def test_flash_attention_op_fwd_bwd(case):
    dtype, d, sq, sk, h, hk, causal, wl, wr = case
    gen = torch.Generator().manual_seed(sq * 31 + sk + d)
    b = 2
    q, k, v, g = (_bshd(b, s, n, d, dtype, gen) for s, n in ((sq, h), (sk, hk), (sk, hk), (sq, h)))
    scale = 0.3
    backends.reset_launch_counts()
    out, lse, seed, offset, debug = ti.flash_attention_forward(
        q, k, v, None, None, sq, sk, 0.0, causal, False, scale=scale,
        window_size_left=wl, window_size_right=wr, block_table=None, num_splits=None)
    dq, dk, dv = ti.flash_attention_backward(
        g, q, k, v, out, lse, None, None, sq, sk, 0.0, causal, seed, offset, scale=scale,
        window_size_left=wl, window_size_right=wr)
    counts = backends.launch_counts()
    assert counts[("interpreter:cpu", "attn_fwd")] == 1
    assert counts[("interpreter:cpu", "attn_bwd_dq")] == 1

    # Outputs as torch's meta kernel shapes them (sizes, strides, dtypes).
    m_out = FA(_meta(q), _meta(k), _meta(v), None, None, sq, sk, 0.0, causal, False,
               scale=scale, window_size_left=wl, window_size_right=wr)
    for mine, meta in zip((out, lse, seed, offset, debug), m_out):
        assert (mine.shape, mine.stride(), mine.dtype) == (meta.shape, meta.stride(), meta.dtype)
    m_grads = FA_BWD(*map(_meta, (g, q, k, v, out, lse)), None, None, sq, sk, 0.0, causal,
                     _meta(seed), _meta(offset), scale=scale,
                     window_size_left=wl, window_size_right=wr)
    for mine, meta in zip((dq, dk, dv), m_grads):
        assert (mine.shape, mine.stride(), mine.dtype) == (meta.shape, meta.stride(), meta.dtype)

    t = lambda x: x.transpose(1, 2)  # noqa: E731  (B, S, H, D) -> (B, H, S, D)
    window = (-1 if wl is None else wl, -1 if wr is None else wr)
    ref.check_all({"out": t(out), "lse": lse, "dq": t(dq), "dk": t(dk), "dv": t(dv)},
                  t(q), t(k), t(v), t(g), scale=scale, causal=causal, window=window)


def test_flash_attention_op_window_as_flash_attn_normalises():
    # flash-attn treats a window size >= seqlen_k as unbounded: with Sq > 2 Sk
    # a right bound of Sk would otherwise leave the first rows empty.
    gen = torch.Generator().manual_seed(0)
    q = _bshd(1, 25, 1, 16, torch.float16, gen)
    k = _bshd(1, 8, 1, 16, torch.float16, gen)
    out, lse, *_ = ti.flash_attention_forward(q, k, k, None, None, 25, 8, 0.0, False, False,
                                              window_size_left=8, window_size_right=8)
    assert torch.isfinite(lse).all()
    ref.check_all({"out": out.transpose(1, 2)}, q.transpose(1, 2), k.transpose(1, 2),
                  k.transpose(1, 2))


@pytest.mark.parametrize("kwargs,reason", [
    # packed batches are 3-D (total, heads, head_dim)
    (dict(cum_seq_q=torch.tensor([0, 8], dtype=torch.int32),
          cum_seq_k=torch.tensor([0, 8], dtype=torch.int32)), "3-D"),
    (dict(cum_seq_q=torch.tensor([0, 8], dtype=torch.int32)), "together"),
    (dict(dropout_p=1.0), "outside"),
    # seqused_k / block_table / num_splits > 1 run on the KV-cache kernels
    # (tests/core/test_kvcache_interpreter.py), but not these
    (dict(block_table=torch.zeros(1, 1, dtype=torch.int32)), "multiple of 16"),
    (dict(num_splits=2, dropout_p=0.5), "dropout"),
    (dict(seqused_k=torch.tensor([8], dtype=torch.int64)), "seqused_k must be a 1-D int32"),
    (dict(alibi_slopes=torch.zeros(1, 1, dtype=torch.float16)), "alibi_slopes must be fp32"),
    (dict(alibi_slopes=torch.zeros(2)), r"alibi_slopes must be \(heads,\)"),
])
def test_flash_attention_op_falls_back_with_reason(kwargs, reason):
    q = torch.randn(1, 8, 1, 16, dtype=torch.float16)
    args = dict(cum_seq_q=None, cum_seq_k=None, max_q=8, max_k=8, dropout_p=0.0,
                is_causal=False, return_debug_mask=False)
    args.update(kwargs)
    pos = [args.pop(n) for n in ("cum_seq_q", "cum_seq_k", "max_q", "max_k", "dropout_p",
                                 "is_causal", "return_debug_mask")]
    with pytest.raises(ti.Unsupported, match=reason):
        ti.flash_attention_forward(q, q, q, *pos, **args)

    # The override hands the very same call to torch's kernel, with the reason.
    calls = []

    def torchs_kernel(keyset, *a, **kw):
        calls.append((keyset, a, kw))
        return "torch's result"

    ov = ti._Overrides.__new__(ti._Overrides)
    ov._orig = {ti._FA: torchs_kernel}
    ti._warned.clear()  # the warning is once per reason
    with pytest.warns(UserWarning, match=reason):
        assert ov._fa_fwd("keyset", q, q, q, *pos, **args) == "torch's result"
    assert calls[0][0] == "keyset" and calls[0][2] == args


def test_flash_attention_backward_falls_back_on_4d_varlen():
    q = torch.randn(1, 8, 1, 16, dtype=torch.float16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ti.Unsupported, match="3-D"):
        ti.flash_attention_backward(q, q, q, q, q, torch.zeros(1, 1, 8), cu, cu, 8, 8, 0.0,
                                    False, None, None)


def test_flash_attention_op_variable_length_batch():
    # Packed (total, H, D) tensors with cum_seq_q/k (nested/jagged tensors
    # call the op so): each sequence matches its own dense reference, and the
    # outputs match torch's meta kernel (logsumexp (H, total_q)).
    lens_q, lens_k, h, d = [3, 17, 9], [12, 5, 9], 2, 32
    gen = torch.Generator().manual_seed(4)
    cu_q = torch.tensor([0, 3, 20, 29], dtype=torch.int32)
    cu_k = torch.tensor([0, 12, 17, 26], dtype=torch.int32)
    q = torch.randn(sum(lens_q), h, d, generator=gen).half()
    k, v = (torch.randn(sum(lens_k), h, d, generator=gen).half() for _ in range(2))
    g = torch.randn(q.shape, generator=gen).half()
    out, lse, seed, offset, debug = ti.flash_attention_forward(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), 0.0, True, False)
    dq, dk, dv = ti.flash_attention_backward(g, q, k, v, out, lse, cu_q, cu_k, max(lens_q),
                                             max(lens_k), 0.0, True, seed, offset)
    if hasattr(torch.library, "get_kernel"):
        # (torch < 2.9 keeps its own op, whose varlen logsumexp was (B, H, max_q))
        m_out = FA(*map(_meta, (q, k, v, cu_q, cu_k)), max(lens_q), max(lens_k), 0.0, True,
                   False)
        for mine, meta in zip((out, lse), m_out):
            assert (mine.shape, mine.stride(), mine.dtype) == (meta.shape, meta.stride(),
                                                               meta.dtype)
    for i in range(3):
        rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        t = lambda x, r: x[r].transpose(0, 1).unsqueeze(0)  # noqa: E731
        ref.check_all({"out": t(out, rq), "lse": lse[:, rq].unsqueeze(0), "dq": t(dq, rq),
                       "dk": t(dk, rk), "dv": t(dv, rk)},
                      t(q, rq), t(k, rk), t(v, rk), t(g, rq), causal=True)


def test_flash_attention_op_dropout_state_and_debug_mask():
    # Dropout: the op returns the RNG state tensors torch's meta kernel
    # describes; the backward regenerates the forward's mask from them, which
    # the debug mask's sign shows (the mask itself is checked against an
    # independent host model of Philox); a second call draws a new mask.
    from support import philox_reference

    gen = torch.Generator().manual_seed(9)
    q, k, v, g = (_bshd(1, 24, 2, 32, torch.float16, gen) for _ in range(4))
    out, lse, seed, offset, debug = ti.flash_attention_forward(
        q, k, v, None, None, 24, 24, 0.3, False, True)
    m_out = FA(*map(_meta, (q, k, v)), None, None, 24, 24, 0.3, False, True)
    for mine, meta in zip((seed, offset), m_out[2:4]):
        assert (mine.shape, mine.dtype) == (meta.shape, meta.dtype)
    assert debug.shape == (1, 2, 24, 24)
    keep = philox_reference.keep_mask_for(ti._rng_inputs(seed, offset), (1, 2, 24, 24), 0.3)
    assert torch.equal(debug >= 0, keep)
    dq, dk, dv = ti.flash_attention_backward(g, q, k, v, out, lse, None, None, 24, 24, 0.3,
                                             False, seed, offset)
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    golden = ref.attention(t(q), t(k), t(v), t(g), keep=keep, dropout_p=0.3)
    lp = ref.attention(t(q), t(k), t(v), t(g), keep=keep, dropout_p=0.3, dtype=torch.float16)
    for name, value in {"out": t(out), "dq": t(dq), "dk": t(dk), "dv": t(dv)}.items():
        ref.check(name, value, golden[name], lp[name], torch.float16)
    again = ti.flash_attention_forward(q, k, v, None, None, 24, 24, 0.3, False, False)[0]
    assert not torch.equal(again, out)


@pytest.mark.parametrize("form,causal,packed", [("h", False, False), ("bh", True, False),
                                                ("bh", True, True), ("h", False, True)])
def test_flash_attention_op_alibi_slopes(form, causal, packed):
    """``alibi_slopes`` of torch's op runs on our kernels: flash-attn's ALiBi
    (bottom-right, per sequence when packed), outputs shaped as torch's meta
    kernel shapes them."""
    gen = torch.Generator().manual_seed(7)
    b, sq, sk, h, hk, d = 2, 19, 27, 4, 2, 64
    q, g = (_bshd(b, sq, h, d, torch.float16, gen) for _ in range(2))
    k, v = (_bshd(b, sk, hk, d, torch.float16, gen) for _ in range(2))
    slopes = torch.rand((h,) if form == "h" else (b, h), generator=gen) * 0.5
    backends.reset_launch_counts()
    if packed:
        cu_q = torch.tensor([0, sq, 2 * sq], dtype=torch.int32)
        cu_k = torch.tensor([0, sk, 2 * sk], dtype=torch.int32)
        out, lse, *_ = ti.flash_attention_forward(
            q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, sq, sk, 0.0, causal,
            False, scale=0.3, alibi_slopes=slopes)
        out = out.unflatten(0, (b, sq))
        lse = lse.unflatten(1, (b, sq)).transpose(0, 1)
    else:
        out, lse, *rest = ti.flash_attention_forward(q, k, v, None, None, sq, sk, 0.0, causal,
                                                     False, scale=0.3, alibi_slopes=slopes)
        m_out = FA(*map(_meta, (q, k, v)), None, None, sq, sk, 0.0, causal, False, scale=0.3,
                   alibi_slopes=_meta(slopes))
        for mine, meta in zip((out, lse, *rest), m_out):
            assert (mine.shape, mine.stride(), mine.dtype) == (meta.shape, meta.stride(),
                                                               meta.dtype)
    assert backends.launch_counts()[("interpreter:cpu", "attn_fwd")] == 1
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    ref.check_all({"out": t(out), "lse": lse}, t(q), t(k), t(v), scale=0.3, causal=causal,
                  alibi_slopes=slopes)
