"""Independent references for the dropout-mask tests (CPU and GPU): flash-attn's
reading of S_dmask, re-implemented from its documented convention, the softmax
probabilities in float64, and torch's tolerance rule of its SDPA tests."""

from __future__ import annotations

import torch


def round128(n: int) -> int:
    return -(-n // 128) * 128


def normalise_like_flash_attn(s_dmask, q, k, scale, vis, block_n):
    """flash-attn's test-side reading of S_dmask, written from its convention:
    crop to (Sq, Sk), zero the entries a row does not see, then per key block
    J of block_n columns multiply |S| by exp(m_J - lse), m_J the suffix
    maximum over blocks >= J of the row's (masked) block maxima. q, k: (B, H,
    S, D) (k repeated for GQA); returns the probabilities (float64) and the
    keep mask (S >= 0)."""
    sq, sk = q.shape[2], k.shape[2]
    s = s_dmask[:, :, :sq, :sk].double().masked_fill(~vis, 0.0)
    kr = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = torch.matmul(q.double(), kr.double().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(scores, -1, keepdim=True)
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))
    probs = []
    starts = range(0, sk, block_n)
    block_max = torch.stack([scores[..., j:j + block_n].amax(-1) for j in starts], -1)
    suffix = block_max.flip(-1).cummax(-1).values.flip(-1)
    for n, j in enumerate(starts):
        probs.append(s[..., j:j + block_n].abs() * torch.exp(suffix[..., n:n + 1] - lse))
    return torch.cat(probs, -1), s >= 0


def softmax_reference(q, k, scale, vis):
    kr = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (torch.matmul(q.double(), kr.double().transpose(-1, -2)) * scale).masked_fill(
        ~vis, float("-inf"))
    rows = vis.any(-1, keepdim=True)
    return torch.softmax(scores.masked_fill(~rows, 0.0), -1) * rows


def check_like_torch(test, golden, lp, fudge):
    """torch's check_out_and_grad: assert_close with atol / rtol of fudge
    times the low-precision reference's own deviation (floored at torch's
    default tolerances of the dtype)."""
    atol0 = {torch.float16: 1e-3, torch.bfloat16: 1e-3, torch.float32: 1e-5}[test.dtype]
    rtol0 = {torch.float16: 1e-3, torch.bfloat16: 1.6e-2, torch.float32: 1.3e-6}[test.dtype]
    dev = golden - lp.to(golden.dtype)
    atol = fudge * max(dev.abs().max().item(), atol0)
    rel = torch.nan_to_num((dev / golden).abs(), nan=rtol0).max().item()
    rtol = fudge * max(rel, rtol0)
    if rtol > 1e30:  # a zero golden element (as torch's get_tolerances)
        rtol = rtol0
    torch.testing.assert_close(test.to(golden.dtype), golden, atol=atol, rtol=rtol)
