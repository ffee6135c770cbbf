"""The sm_90 Gluon dK/dV kernel (kernels/flash_attention_sm90_bwd.py) on the H100.

The installed sm_90 archive ships it for the unmasked head-dim-256 points
(fp16/bf16, no bias or dropout). Each case first checks, from the archive's
manifest, that the kernel runs there (so it cannot pass on the Triton kernel
by accident), then judges dQ, dK and dV (and the forward's output) against
float32 math with PyTorch's tolerance model: causal and not, bottom-right
diagonals with Sq != Sk (rows that see no key), GQA (dK/dV summed over the
group's heads), sliding windows, ragged ends, a variable-length batch with an
empty last sequence, K/V broadcast along the sequence. Skipped without a GPU
or an installed sm_90 image."""

from __future__ import annotations

import pytest
import torch

import aotriton_rocm
from support import attn_reference as ref
from support.gpu import ours, randn, require_sm90_function

pytestmark = [pytest.mark.gpu(arch="sm_90"), pytest.mark.usefixtures("enabled")]


def _require_gluon(dtype, seqlen_k):
    require_sm90_function("attn_bwd_dkdv", "flash_attention_sm90_bwd:attn_bwd_dkdv", dtype, 256, seqlen_k)


# (dtype, batch, heads, kv heads, seqlen_q, seqlen_k, causal, window)
CASES = [
    (torch.float16, 2, 4, 4, 1000, 1000, False, (-1, -1)),
    (torch.bfloat16, 2, 4, 4, 1500, 1500, True, (-1, -1)),
    (torch.bfloat16, 1, 8, 2, 1100, 2049, True, (-1, -1)),   # GQA, ragged K, shifted diagonal
    (torch.float16, 1, 4, 4, 2100, 1030, True, (-1, -1)),    # Sq > Sk: top rows see no key
    (torch.bfloat16, 2, 4, 4, 1536, 1536, False, (300, 40)),  # sliding window
    (torch.float16, 1, 4, 2, 4096, 4096, True, (-1, -1)),
]


@pytest.mark.parametrize("dtype,b,h,hk,sq,sk,causal,window", CASES,
                         ids=[f"{str(c[0])[6:]}-h{c[2]}:{c[3]}-{c[4]}x{c[5]}-"
                              f"{'causal' if c[6] else 'full'}{'-win' if c[7] != (-1, -1) else ''}"
                              for c in CASES])
def test_gluon_dkdv_matches_math(dtype, b, h, hk, sq, sk, causal, window):
    _require_gluon(dtype, sk)
    # flash-attn's layout (batch, seqlen, heads, head_dim)
    q, k, v, g = (randn(b, s, n, 256, dtype=dtype, seed=i)
                  for i, (s, n) in enumerate(((sq, h), (sk, hk), (sk, hk), (sq, h))))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    aotriton_rocm.reset_launch_counts()
    out = aotriton_rocm.flash_attn_func(q, k, v, causal=causal, window_size=window)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    assert ours("attn_bwd_dkdv") == 1
    bhsd = [t.detach().transpose(1, 2) for t in (q, k, v, g)]
    ref.check_all({"out": out.transpose(1, 2), "dq": dq.transpose(1, 2), "dk": dk.transpose(1, 2),
                   "dv": dv.transpose(1, 2)}, *bhsd, causal=causal, window=window)


def _check_grads(grads, q, k, v, g, causal, dtype):
    bhsd = [t.detach().transpose(1, 2) for t in (q, k, v, g)]
    golden = ref.attention(*bhsd, causal=causal, dtype=torch.float32)
    lp = ref.attention(*bhsd, causal=causal, dtype=dtype)
    for name, value in zip(("dq", "dk", "dv"), grads):
        ref.check(name, value.transpose(1, 2), golden[name], lp[name], dtype)


def test_gluon_dkdv_varlen_with_an_empty_last_sequence():
    """Per-sequence TMA descriptors: blocks past a sequence's end read
    zeros, and programs of the empty last sequence copy nothing."""
    _require_gluon(torch.bfloat16, 2100)
    lens_q, lens_k, h = [1300, 37, 2000, 0], [1300, 1900, 1111, 700], 4
    cu_q, cu_k = (torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda", dtype=torch.int32)
                  for lens in (lens_q, lens_k))
    q, g = (randn(sum(lens_q), h, 256, dtype=torch.bfloat16, seed=s) for s in (1, 2))
    k, v = (randn(sum(lens_k), h, 256, dtype=torch.bfloat16, seed=s).requires_grad_(True) for s in (3, 4))
    q.requires_grad_(True)
    aotriton_rocm.reset_launch_counts()
    out = aotriton_rocm.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    assert ours("attn_bwd_dkdv") == 1
    for i in range(len(lens_q)):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        if lens_q[i] == 0:  # keys no query sees get zero gradients
            assert not dk[ks].any() and not dv[ks].any()
            continue
        _check_grads((dq[qs][None], dk[ks][None], dv[ks][None]),
                     *(t[None] for t in (q[qs], k[ks], v[ks], g[qs])), True, torch.bfloat16)


def test_gluon_dkdv_with_kv_broadcast_along_the_sequence():
    """K/V with row stride 0 (one row expanded): the copies follow any stride."""
    _require_gluon(torch.float16, 1500)
    h = 4
    q, g = (randn(1, 1200, h, 256, dtype=torch.float16, seed=s) for s in (5, 6))
    q.requires_grad_(True)
    k, v = (randn(1, 1, h, 256, dtype=torch.float16, seed=s).requires_grad_(True) for s in (7, 8))
    ke, ve = (t.expand(1, 1500, h, 256) for t in (k, v))
    assert ke.stride(1) == 0
    aotriton_rocm.reset_launch_counts()
    out = aotriton_rocm.flash_attn_func(q, ke, ve, causal=False)
    dq, dk, dv = torch.autograd.grad(out, (q, ke, ve), g)
    assert ours("attn_bwd_dkdv") == 1
    _check_grads((dq, dk, dv), q, ke, ve, g, False, torch.float16)
