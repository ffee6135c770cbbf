"""Independent float64 references for the KV-cache tests (not a test module):
the cache gathered position by position, masks, softcap and ALiBi written
out, and the append + rotary of flash_attn_with_kvcache as plain loops."""

from __future__ import annotations

import math

import torch


def gather(cache, b, positions, cache_batch_idx=None, block_table=None):
    """Rows of ``cache`` at batch b's cache ``positions`` (a list of ints)."""
    rows = []
    for p in positions:
        if block_table is not None:
            page = cache.shape[1]
            rows.append(cache[int(block_table[b, p // page]), p % page])
        else:
            row = b if cache_batch_idx is None else int(cache_batch_idx[b])
            rows.append(cache[row, p])
    if not rows:
        return cache.new_zeros((0, *cache.shape[2:]))
    return torch.stack(rows)


def attention(q, k_cache, v_cache, k_end, *, k_start=None, cache_batch_idx=None, block_table=None,
              alibi_slopes=None, scale=None, causal=False, window=(-1, -1), softcap=0.0):
    """(out (B, Sq, H, D), lse (B, H, Sq)) in float64; rows that see no key
    give 0 and +inf."""
    b_, sq, h, d = q.shape
    hk = k_cache.shape[2]
    group = h // hk
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(b_, sq, h, d, dtype=torch.float64)
    lse = torch.full((b_, h, sq), math.inf, dtype=torch.float64)
    left, right = window
    if causal:
        right = 0
    for b in range(b_):
        first = 0 if k_start is None else int(k_start[b])
        positions = list(range(first, int(k_end[b])))
        n = len(positions)
        keys = gather(k_cache, b, positions, cache_batch_idx, block_table).double()
        values = gather(v_cache, b, positions, cache_batch_idx, block_table).double()
        for hh in range(h):
            kh = keys[:, hh // group]
            vh = values[:, hh // group]
            for i in range(sq):
                s = (kh @ q[b, i, hh].double()) * scale
                if softcap > 0:
                    s = softcap * torch.tanh(s / softcap)
                j = torch.arange(n, dtype=torch.float64)
                if alibi_slopes is not None:
                    slope = alibi_slopes[hh] if alibi_slopes.dim() == 1 else alibi_slopes[b, hh]
                    s = s - float(slope) * (i + n - sq - j).abs()
                visible = torch.ones(n, dtype=torch.bool)
                if left >= 0:
                    visible &= j >= i + n - sq - left
                if right >= 0:
                    visible &= j <= i + n - sq + right
                if not visible.any():
                    continue
                s = s[visible]
                m = torch.logsumexp(s, 0)
                out[b, i, hh] = torch.softmax(s, 0) @ vh[visible]
                lse[b, hh, i] = m
    return out, lse


def rotate(x, cos, sin, positions, interleaved):
    """Rotary embedding, one vector at a time (float64): x (B, S, H, D),
    positions (B, S) ints."""
    x = x.double().clone()
    half = cos.shape[1]
    for b in range(x.shape[0]):
        for s in range(x.shape[1]):
            c = cos[int(positions[b][s])].double()
            sn = sin[int(positions[b][s])].double()
            for i in range(half):
                a, bb = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
                x0, x1 = x[b, s, :, a].clone(), x[b, s, :, bb].clone()
                x[b, s, :, a] = x0 * c[i] - x1 * sn[i]
                x[b, s, :, bb] = x0 * sn[i] + x1 * c[i]
    return x


def attention_fast(q, k_cache, v_cache, k_end, *, k_start=None, cache_batch_idx=None,
                   block_table=None, alibi_slopes=None, scale=None, causal=False, window=(-1, -1),
                   softcap=0.0, dtype=torch.float32):
    """:func:`attention` vectorised over heads and queries (one batch at a
    time, on q's device, in ``dtype``): for the GPU tests' larger sizes."""
    b_, sq, h, d = q.shape
    group = h // k_cache.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(b_, sq, h, d, dtype=dtype, device=q.device)
    lse = torch.full((b_, h, sq), math.inf, dtype=dtype, device=q.device)
    left, right = window
    if causal:
        right = 0
    for b in range(b_):
        first = 0 if k_start is None else int(k_start[b])
        pos = torch.arange(first, int(k_end[b]), device=q.device)
        n = pos.numel()
        if block_table is not None:
            page = k_cache.shape[1]
            blocks = block_table[b].long()[pos // page]
            keys, values = k_cache[blocks, pos % page], v_cache[blocks, pos % page]
        else:
            row = b if cache_batch_idx is None else int(cache_batch_idx[b])
            keys, values = k_cache[row, pos], v_cache[row, pos]
        keys = keys.to(dtype).repeat_interleave(group, dim=1)
        values = values.to(dtype).repeat_interleave(group, dim=1)
        s = torch.einsum("ihd,jhd->hij", q[b].to(dtype), keys) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(n, device=q.device)[None, :]
        if alibi_slopes is not None:
            slope = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]
            s = s - slope.to(dtype)[:, None, None] * (i + n - sq - j).abs().to(dtype)
        visible = torch.ones(sq, n, dtype=torch.bool, device=q.device)
        if left >= 0:
            visible &= j >= i + n - sq - left
        if right >= 0:
            visible &= j <= i + n - sq + right
        s = s.masked_fill(~visible, -math.inf)
        m = torch.logsumexp(s, -1)
        p = torch.exp(s - m[..., None]).nan_to_num(0.0)
        out[b] = torch.einsum("hij,jhd->ihd", p, values)
        lse[b] = torch.where(m == -math.inf, math.inf, m)
    return out, lse
