"""Sequences that do not lie end to end (the kernels' STARTS/LENGTHS bits of
``varlen``, kernels/flash_attention.py): Transformer Engine's padded layout
(each side's starts apart from its cumulative lengths) and PyTorch's
seqused_k (K's lengths one per sequence, its starts from the cumulative
vector), forward and backward in Triton's interpreter on the CPU, judged per
sequence against torch's float32/float64 math as the packed batch is."""

from __future__ import annotations

from support import attn_reference
import pytest
import torch

from aotriton_rocm.core import attention

pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")

Q_STARTS, Q_LENGTHS, K_STARTS, K_LENGTHS = 2, 4, 8, 16


def _vector(first, second, batch):
    """One side's vector: batch + 1 entries, then batch + 1 more."""
    first, second = list(first), list(second)
    first += [0] * (batch + 1 - len(first))
    second += [0] * (batch + 1 - len(second))
    return torch.tensor(first + second, dtype=torch.int32)


def _cumulative(lens):
    return [0, *torch.tensor(lens).cumsum(0).tolist()]


# (name, q starts or None, q lens, k starts or None, k lens, k lens individual, rows q, rows k)
LAYOUTS = [
    # TE's cu_seqlens_padded: every sequence in a slot with padding after it
    ("padded", [3, 20, 41], [5, 12, 1], [0, 16, 40], [9, 17, 4], False, 48, 50),
    # seqused_k: K's slots are cu_seqlens_k, of which the first seqused_k[b] rows are keys
    ("seqused_k", None, [5, 12, 7], [0, 14, 40], [9, 17, 4], True, 24, 52),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=[x[0] for x in LAYOUTS])
@pytest.mark.parametrize("dtype,causal", [(torch.float16, True), (torch.float32, False)])
def test_placed_sequences(layout, dtype, causal):
    name, starts_q, lens_q, starts_k, lens_k, individual, rows_q, rows_k = layout
    h, hk, d = 4, 2, 24
    gen = torch.Generator().manual_seed(len(name) + int(causal))
    batch = len(lens_q)
    word = 1
    if starts_q is None:
        cu_q, starts_q = _vector(_cumulative(lens_q), [], batch), _cumulative(lens_q)[:-1]
    else:
        cu_q, word = _vector(_cumulative(lens_q), starts_q, batch), word | Q_STARTS
    if individual:
        cu_k, word = _vector(lens_k, starts_k, batch), word | K_STARTS | K_LENGTHS
    else:
        cu_k, word = _vector(_cumulative(lens_k), starts_k, batch), word | K_STARTS
    q = torch.randn((rows_q, h, d), generator=gen).to(dtype)
    k, v = (torch.randn((rows_k, hk, d), generator=gen).to(dtype) for _ in range(2))
    do = torch.randn(q.shape, generator=gen).to(dtype)
    varlen = attention.Varlen(cu_q, cu_k, max(lens_q), max(lens_k), word=word)
    assert varlen.batch == batch
    assert attention.unsupported_reason(q, k, v, varlen=varlen) is None
    out, lse = attention.forward(q, k, v, is_causal=causal, varlen=varlen)
    dq, dk, dv = attention.backward(do, q, k, v, out, lse, is_causal=causal, varlen=varlen)
    for i in range(batch):
        rq = slice(starts_q[i], starts_q[i] + lens_q[i])
        rk = slice(starts_k[i], starts_k[i] + lens_k[i])

        def seq(t, rows):
            return t[rows].transpose(0, 1).unsqueeze(0)

        got = {"out": seq(out, rq), "lse": lse[:, rq].unsqueeze(0), "dq": seq(dq, rq),
               "dk": seq(dk, rk), "dv": seq(dv, rk)}
        args = (seq(q, rq), seq(k, rk), seq(v, rk), seq(do, rq))
        golden = attn_reference.attention(*args, causal=causal,
                                          dtype=attn_reference.golden_dtype(dtype))
        lp = attn_reference.attention(*args, causal=causal, dtype=dtype)
        for key, value in got.items():
            attn_reference.check(key, value, golden[key], lp[key], dtype, guard=8.0)
