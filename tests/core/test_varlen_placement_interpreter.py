"""Sequences that do not lie end to end (``Varlen.seq_starts_q/k`` and
``seqlens_k``, which libaotriton_rocm turns into the kernels' STARTS/LENGTHS
bits of ``varlen``): Transformer Engine's padded layout (each side's starts
apart from its cumulative lengths) and flash-attn's seqused_k (K's lengths
one per sequence, its slots from cu_seqlens_k), forward and backward in
Triton's interpreter on the CPU, judged per sequence against torch's
float32/float64 math as the packed batch is."""

from __future__ import annotations

from support import attn_reference
import pytest
import torch

from aotriton_rocm.core import attention

pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")

def _cumulative(lens):
    return [0, *torch.tensor(lens).cumsum(0).tolist()]


def _int32(values):
    return None if values is None else torch.tensor(values, dtype=torch.int32)


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
    cu_q = _int32(_cumulative(lens_q))
    if individual:  # flash-attn's seqused_k: K's slots from cu_seqlens_k, its lengths apart
        cu_k, placed = _int32([*starts_k, rows_k]), dict(seqlens_k=_int32(lens_k))
    else:  # Transformer Engine's padded slots
        cu_k, placed = _int32(_cumulative(lens_k)), dict(seq_starts_k=_int32(starts_k))
    placed["seq_starts_q"] = _int32(starts_q)
    if starts_q is None:
        starts_q = _cumulative(lens_q)[:-1]
    q = torch.randn((rows_q, h, d), generator=gen).to(dtype)
    k, v = (torch.randn((rows_k, hk, d), generator=gen).to(dtype) for _ in range(2))
    do = torch.randn(q.shape, generator=gen).to(dtype)
    varlen = attention.Varlen(cu_q, cu_k, max(lens_q), max(lens_k), **placed)
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
