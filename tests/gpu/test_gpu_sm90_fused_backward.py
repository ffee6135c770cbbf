"""The fused backward (kernels/flash_attention_sm90_bwd_fused.py) on the H100.

The installed sm_90 archive ships it for the unmasked head-dim-64 and 128
points (fp16/bf16, no bias or dropout), for sequences of at least its
MIN_SEQLEN.
Each case checks by launch counts which route ran (fused: attn_bwd_fused +
attn_bwd_dq_convert; split: attn_bwd_dkdv + attn_bwd_dq), then judges dQ, dK
and dV against float32 math with PyTorch's tolerance model: causal and not,
Sq != Sk, GQA, sliding windows, ragged ends, a variable-length batch with an
empty sequence. Under torch's deterministic mode the split kernels run and
two backwards agree bit for bit. Skipped without a GPU or an installed sm_90
image."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import aotriton_rocm
from aotriton_rocm.common import archive, images
from support import attn_reference as ref
from support.gpu import ours, randn

pytestmark = [pytest.mark.gpu(arch="sm_90"), pytest.mark.usefixtures("enabled")]



def _min_seqlen() -> int:
    """MIN_SEQLEN of the shipped fused kernel (skips if the archive has none)."""
    records = archive.Archive.open(images.find_archives()["sm_90"]).find("attn_bwd_fused")
    found = [r.config["MIN_SEQLEN"] for r in records]
    if not found:
        pytest.skip("the installed sm_90 archive has no fused backward")
    return max(found)


def _backward(q, k, v, g, **kw):
    aotriton_rocm.reset_launch_counts()
    out = aotriton_rocm.flash_attn_func(q, k, v, **kw)
    return out, torch.autograd.grad(out, (q, k, v), g)


def _route() -> str:
    fused, split = ours("attn_bwd_fused"), ours("attn_bwd_dkdv")
    assert (fused, ours("attn_bwd_dq_convert")) in ((1, 1), (0, 0)) and fused + split == 1
    assert ours("attn_bwd_dq") == split
    return "fused" if fused else "split"


def _inputs(dtype, b, h, hk, sq, sk, d=64):
    q, k, v, g = (randn(b, s, n, d, dtype=dtype, seed=i)
                  for i, (s, n) in enumerate(((sq, h), (sk, hk), (sk, hk), (sq, h))))
    return (*(t.requires_grad_(True) for t in (q, k, v)), g)


def _judge(out, grads, q, k, v, g, **mask):
    bhsd = [t.detach().transpose(1, 2) for t in (q, k, v, g)]
    results = {"out": out}
    results.update(zip(("dq", "dk", "dv"), grads))
    ref.check_all({n: t.transpose(1, 2) for n, t in results.items()}, *bhsd, **mask)


# (head dim, dtype, batch, heads, kv heads, seqlen_q, seqlen_k, causal, window)
CASES = [
    (64, torch.float16, 1, 4, 4, 4096, 4096, False, (-1, -1)),
    (64, torch.bfloat16, 1, 4, 4, 4096, 4096, True, (-1, -1)),
    (64, torch.bfloat16, 1, 8, 2, 3000, 4199, True, (-1, -1)),   # GQA, ragged, shifted diagonal
    (64, torch.float16, 1, 4, 4, 5000, 3100, True, (-1, -1)),    # Sq > Sk: top rows see no key
    (64, torch.bfloat16, 2, 2, 2, 4100, 4100, False, (700, 90)),  # sliding window, ragged
    (128, torch.float16, 1, 4, 4, 4096, 4096, True, (-1, -1)),
    (128, torch.bfloat16, 1, 8, 2, 2500, 4500, False, (-1, -1)),  # GQA, Sq != Sk
    (128, torch.bfloat16, 2, 2, 2, 5000, 3100, True, (-1, -1)),
]


@pytest.mark.parametrize("d,dtype,b,h,hk,sq,sk,causal,window", CASES,
                         ids=[f"d{c[0]}-{str(c[1])[6:]}-h{c[3]}:{c[4]}-{c[5]}x{c[6]}-"
                              f"{'causal' if c[7] else 'full'}{'-win' if c[8] != (-1, -1) else ''}"
                              for c in CASES])
def test_fused_backward_matches_math(d, dtype, b, h, hk, sq, sk, causal, window):
    assert min(sq, sk) >= _min_seqlen()
    q, k, v, g = _inputs(dtype, b, h, hk, sq, sk, d)
    out, grads = _backward(q, k, v, g, causal=causal, window_size=window)
    assert _route() == "fused"
    _judge(out, grads, q, k, v, g, causal=causal, window=window)


def test_short_sequences_take_the_split_kernels():
    short = _min_seqlen() - 1
    q, k, v, g = _inputs(torch.float16, 2, 4, 4, short, short)
    out, grads = _backward(q, k, v, g, causal=True)
    assert _route() == "split"
    _judge(out, grads, q, k, v, g, causal=True)


def test_head_dims_without_the_fused_kernel_take_the_split_kernels():
    _min_seqlen()
    q, k, v, g = _inputs(torch.bfloat16, 1, 2, 2, 4096, 4096, d=256)
    _backward(q, k, v, g, causal=True)
    assert _route() == "split"


def test_varlen_with_an_empty_sequence():
    """Per-sequence descriptors: the dQ sums of one sequence never spill into
    the next, and an empty sequence contributes nothing."""
    n = _min_seqlen()
    lens_q, lens_k, h = [n + 300, 0, n + 1000], [n + 900, n + 17, n], 4
    cu_q, cu_k = (torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda", dtype=torch.int32)
                  for lens in (lens_q, lens_k))
    q, g = (randn(sum(lens_q), h, 64, dtype=torch.bfloat16, seed=s) for s in (1, 2))
    k, v = (randn(sum(lens_k), h, 64, dtype=torch.bfloat16, seed=s) for s in (3, 4))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    aotriton_rocm.reset_launch_counts()
    out = aotriton_rocm.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    assert _route() == "fused"
    for i in range(len(lens_q)):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        if lens_q[i] == 0:
            assert not dk[ks].any() and not dv[ks].any()
            continue
        _judge(out[qs][None], (dq[qs][None], dk[ks][None], dv[ks][None]),
               *(t[None] for t in (q[qs], k[ks], v[ks], g[qs])), causal=True)


def test_deterministic_mode_runs_the_split_kernels_bit_for_bit():
    n = _min_seqlen()
    q, k, v, g = _inputs(torch.float16, 1, 4, 4, n + 1000, n + 1000)
    torch.use_deterministic_algorithms(True)
    try:
        _, first = _backward(q, k, v, g, causal=True)
        assert _route() == "split"
        _, second = _backward(q, k, v, g, causal=True)
    finally:
        torch.use_deterministic_algorithms(False)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_sdpa_runs_the_fused_backward():
    """torch's scaled_dot_product_attention on its FLASH backend (our kernels)
    takes the fused route too, and agrees with the math backend."""
    n = _min_seqlen()
    q, k, v, g = (randn(1, 4, n + 100, 64, dtype=torch.float16, seed=s) for s in range(4))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    aotriton_rocm.reset_launch_counts()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        grads = torch.autograd.grad(out, (q, k, v), g)
    assert _route() == "fused"
    results = {"out": out}
    results.update(zip(("dq", "dk", "dv"), grads))
    ref.check_all(results, *(t.detach() for t in (q, k, v, g)), causal=True, alignment="top_left")
