"""The sm_90 Gluon forward (kernels/flash_attention_sm90.py) on the H100.

The installed sm_90 archive ships it for the fast-path points (fp16/bf16,
head dim 64/128, no bias or dropout) in the sequence-length buckets where the
tuning file chose it. Each case first checks, from the archive's manifest,
that the bucket of its length runs the Gluon kernel (so the case cannot pass
on the Triton kernel by accident), then judges output, LSE and gradients
against float32 math with PyTorch's tolerance model: causal and not, bottom-
right diagonals with Sq != Sk (rows that see no key), GQA, sliding windows,
ragged ends, variable-length batches (one with an empty last sequence), K/V
broadcast along the sequence; and replays a CUDA graph of it (its TMA
descriptors live in per-launch scratch). Skipped without a GPU or an
installed sm_90 image."""

from __future__ import annotations

import pytest
import torch

import aotriton_rocm
from support import attn_reference as ref
from support.gpu import ours, randn, require_sm90_function

pytestmark = [pytest.mark.gpu(arch="sm_90"), pytest.mark.usefixtures("enabled")]


def _require_gluon(dtype, head_dim, seqlen):
    require_sm90_function("attn_fwd", "flash_attention_sm90:attn_fwd", dtype, head_dim, seqlen)


# (dtype, head_dim, batch, heads, kv heads, seqlen_q, seqlen_k, causal, window)
CASES = [
    (torch.float16, 128, 2, 4, 4, 1500, 1500, False, (-1, -1)),
    (torch.bfloat16, 128, 2, 4, 4, 1500, 1500, True, (-1, -1)),
    (torch.bfloat16, 128, 1, 8, 2, 1100, 2049, True, (-1, -1)),   # GQA, ragged K, shifted diagonal
    (torch.float16, 128, 1, 4, 4, 2100, 1030, True, (-1, -1)),    # Sq > Sk: top rows see no key
    (torch.bfloat16, 128, 2, 4, 4, 1536, 1536, False, (300, 40)),  # sliding window
    (torch.float16, 128, 1, 4, 2, 4096, 4096, True, (-1, -1)),
    # S = 513-1024 (Gluon since the Q split); the last block's second half
    # of rows lies past the end, so its warpgroup copies no Q
    (torch.bfloat16, 128, 2, 4, 4, 900, 900, True, (-1, -1)),
    (torch.float16, 128, 1, 8, 2, 1000, 650, False, (-1, -1)),
    (torch.bfloat16, 64, 1, 4, 2, 8300, 8300, True, (-1, -1)),     # head dim 64: above S = 4096
    (torch.float16, 64, 1, 4, 4, 9000, 9000, False, (-1, -1)),
]


@pytest.mark.parametrize("dtype,d,b,h,hk,sq,sk,causal,window", CASES,
                         ids=[f"{str(c[0])[6:]}-d{c[1]}-h{c[3]}:{c[4]}-{c[5]}x{c[6]}-"
                              f"{'causal' if c[7] else 'full'}{'-win' if c[8] != (-1, -1) else ''}"
                              for c in CASES])
def test_gluon_forward_matches_math(dtype, d, b, h, hk, sq, sk, causal, window):
    _require_gluon(dtype, d, sq)
    # flash-attn's layout (batch, seqlen, heads, head_dim)
    q, k, v, g = (randn(b, s, n, d, dtype=dtype, seed=i)
                  for i, (s, n) in enumerate(((sq, h), (sk, hk), (sk, hk), (sq, h))))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    aotriton_rocm.reset_launch_counts()
    out, lse, _ = aotriton_rocm.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                                return_attn_probs=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    assert ours("attn_fwd") == 1
    bhsd = [t.detach().transpose(1, 2) for t in (q, k, v, g)]
    ref.check_all({"out": out.transpose(1, 2), "lse": lse, "dq": dq.transpose(1, 2),
                   "dk": dk.transpose(1, 2), "dv": dv.transpose(1, 2)},
                  *bhsd, causal=causal, window=window)


def _varlen_forward(lens_q, lens_k, dtype, causal, seed):
    """A packed batch of these lengths (4 heads, head dim 128) through
    flash_attn_varlen_func: (out, q, k, v, cu_q, cu_k)."""
    h, d = 4, 128
    cu_q, cu_k = (torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda", dtype=torch.int32)
                  for lens in (lens_q, lens_k))
    q = randn(sum(lens_q), h, d, dtype=dtype, seed=seed)
    k, v = (randn(sum(lens_k), h, d, dtype=dtype, seed=seed + s) for s in (1, 2))
    out = aotriton_rocm.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
    return out, q, k, v, cu_q, cu_k


def _check_sequences(out, q, k, v, cu_q, cu_k, sequences, causal, dtype):
    """Each of these sequences of a packed batch against float32 math."""
    for i in sequences:
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        one = [t[None].transpose(1, 2) for t in (q[qs], k[ks], v[ks])]
        golden = ref.attention(*one, causal=causal, dtype=torch.float32)
        lp = ref.attention(*one, causal=causal, dtype=dtype)
        ref.check("out", out[qs][None].transpose(1, 2), golden["out"], lp["out"], dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gluon_forward_varlen(dtype):
    lens_q, lens_k = [1300, 37, 2000], [1300, 1900, 1111]
    _require_gluon(dtype, 128, max(lens_q))
    aotriton_rocm.reset_launch_counts()
    out, *packed = _varlen_forward(lens_q, lens_k, dtype, causal=True, seed=1)
    assert ours("attn_fwd") == 1
    _check_sequences(out, *packed, range(len(lens_q)), True, dtype)


def test_gluon_forward_empty_and_broadcast_sequences():
    """Programs past an empty last sequence (its rows start at the tensor's
    end), and K/V broadcast along the sequence (row stride 0): the copies
    must stay inside each sequence and follow any stride."""
    _require_gluon(torch.bfloat16, 128, 2000)
    out, *packed = _varlen_forward([2000, 1200, 0], [1500, 2100, 700], torch.bfloat16, causal=False, seed=4)
    _check_sequences(out, *packed, range(2), False, torch.bfloat16)

    h, d = 4, 128
    q = randn(1, 2048, h, d, dtype=torch.bfloat16, seed=7)
    k, v = (randn(1, 1, h, d, dtype=torch.bfloat16, seed=s).expand(1, 3000, h, d) for s in (8, 9))
    assert k.stride(1) == 0
    aotriton_rocm.reset_launch_counts()
    out = aotriton_rocm.flash_attn_func(q, k, v, causal=True)
    assert ours("attn_fwd") == 1
    bhsd = [t.transpose(1, 2) for t in (q, k, v)]
    ref.check("out", out.transpose(1, 2), ref.attention(*bhsd, causal=True, dtype=torch.float32)["out"],
              ref.attention(*bhsd, causal=True, dtype=torch.bfloat16)["out"], torch.bfloat16)


def test_gluon_forward_in_a_cuda_graph():
    """The per-launch global scratch (the kernel's TMA descriptors) is
    allocated in stream order, so capture and replay work."""
    _require_gluon(torch.float16, 128, 4096)
    q, k, v = (randn(1, 4096, 8, 128, dtype=torch.float16, seed=i) for i in range(3))
    eager = aotriton_rocm.flash_attn_func(q, k, v, causal=True)
    static_out = torch.empty_like(eager)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        static_out.copy_(aotriton_rocm.flash_attn_func(q, k, v, causal=True))  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out.copy_(aotriton_rocm.flash_attn_func(q, k, v, causal=True))
    static_out.zero_()
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, eager)
