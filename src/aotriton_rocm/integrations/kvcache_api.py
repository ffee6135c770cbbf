"""flash-attn's ``flash_attn_with_kvcache`` on our kernels.

The new keys/values are rotated (optional rotary embedding) and written into
the caches with torch ops (a handful of small indexed copies, no host
synchronisation); the attention itself runs in ``attn_fwd_kvcache`` (and its
split-KV combine), see :mod:`aotriton_rocm.kvcache`.
"""

from __future__ import annotations

import operator

import torch

from ..core.attention import flash_attn_window
from ..core.kvcache import check as kvcache_check
from ..core.native import NativeError
from .flash_attn_ops import (check_operands, fail, flash_attn_kvcache, refusal_kept, refuse,
                             schema_refused)

__all__ = ["flash_attn_with_kvcache", "apply_rotary", "varlen_paged_forward"]

API = "flash_attn_with_kvcache"
VARLEN_API = "flash_attn_varlen_func"  # its paged caches (varlen_paged_forward)


def _fail(reason: str):
    fail(API, reason)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                 interleaved: bool) -> torch.Tensor:
    """x (B, S, H, D) rotated at ``positions`` (B, S) by the tables ``cos``,
    ``sin`` (seqlen_ro, rotary_dim / 2) over its first rotary_dim features
    (the rest unchanged), computed in fp32 and returned in x's dtype.
    Interleaved (GPT-J): feature pairs (0, 1), (2, 3), ...; otherwise
    (GPT-NeoX): pairs (i, i + rotary_dim / 2)."""
    half = cos.shape[1]
    rot = 2 * half
    c = cos.float()[positions][:, :, None, :]
    s = sin.float()[positions][:, :, None, :]
    xf = x[..., :rot].float()
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xf[..., :half], xf[..., half:]
        rotated = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., rot:]), dim=-1)


def _seqlens(cache_seqlens, batch: int, capacity: int, device) -> torch.Tensor:
    """The cache lengths as a tensor (an int broadcasts to int32 (batch,);
    None is the whole cache, as flash-attn)."""
    if cache_seqlens is None:
        return torch.full((batch,), capacity, dtype=torch.int32, device=device)
    if isinstance(cache_seqlens, torch.Tensor):
        if cache_seqlens.dim() == 0:
            cache_seqlens = cache_seqlens.reshape(1).expand(batch)
        # its dtype and shape are the library's to judge (as cache_seqlens)
        if cache_seqlens.device != device:
            _fail(f"cache_seqlens must be on the query's device ({device})")
        return cache_seqlens
    try:
        n = operator.index(cache_seqlens)
    except TypeError:
        _fail(f"cache_seqlens must be an int or an int32 tensor, got {type(cache_seqlens).__name__}")
    return torch.full((batch,), n, dtype=torch.int32, device=device)


def _check_new(k, v, k_cache, batch):
    if (k is None) != (v is None):
        _fail("k and v (the new keys and values) must be given together")
    if k is None:
        return 0
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            _fail(f"{name} must be a 4-D (batch, seqlen_new, nheads_k, headdim) tensor")
        if t.shape[0] != batch or t.shape[2:] != k_cache.shape[2:]:
            _fail(f"{name} of shape {tuple(t.shape)} must be (batch, seqlen_new, nheads_k, headdim) "
                  f"= ({batch}, seqlen_new, {k_cache.shape[2]}, {k_cache.shape[3]})")
        if t.dtype != k_cache.dtype or t.device != k_cache.device:
            _fail(f"{name} must have the caches' dtype and device")
    if k.shape != v.shape:
        _fail(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ in shape")
    return k.shape[1]


def _check_rotary(rotary_cos, rotary_sin, q, has_new):
    if rotary_cos is None and rotary_sin is None:
        return
    if rotary_cos is None or rotary_sin is None:
        _fail("rotary_cos and rotary_sin must be given together")
    if not has_new:
        _fail("rotary_cos/rotary_sin rotate the new keys: pass k and v too")
    if rotary_cos.dim() != 2 or rotary_cos.shape != rotary_sin.shape:
        _fail("rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2)")
    if 2 * rotary_cos.shape[1] > q.shape[-1] or rotary_cos.shape[1] == 0:
        _fail(f"rotary_dim = 2 * rotary_cos.shape[1] = {2 * rotary_cos.shape[1]} must be in "
              f"[2, headdim = {q.shape[-1]}]")
    if rotary_cos.device != q.device or rotary_sin.device != q.device:
        _fail("rotary_cos and rotary_sin must be on the query's device")


def _cache_slots(positions, cache_batch_idx, block_table, batch, page_size):
    """(cache row or page, row in it) index tensors of cache positions (B, S)."""
    if block_table is not None:
        return block_table.long().gather(1, positions // page_size), positions % page_size
    rows = (torch.arange(batch, device=positions.device) if cache_batch_idx is None
            else cache_batch_idx.long())
    return rows[:, None].expand_as(positions), positions


def _append(k_cache, v_cache, k, v, slots) -> None:
    """k, v (B, S, Hk, D) written into the caches at ``slots``: one
    ``index_copy_`` each over the (row or page, position) rows merged where
    the caches' layout allows that view (the usual one), else
    ``index_put_`` (several kernels on a GPU)."""
    block, pos = slots
    rows = None
    for cache, new in ((k_cache, k), (v_cache, v)):
        if not _flat(cache):
            cache.index_put_(slots, new)
            continue
        if rows is None:
            rows = (block * cache.shape[1] + pos).flatten()
        cache.view(-1, *cache.shape[2:]).index_copy_(0, rows, new.reshape(-1, *new.shape[2:]))


def _flat(cache) -> bool:
    """Whether the cache's (row or page, position) dims merge into one."""
    return cache.stride(0) == cache.shape[1] * cache.stride(1)


def _append_dense(k_cache, v_cache, k, v, seqlens) -> None:
    """:func:`_append` for dense caches whose batch b uses row b, laid out
    so that rows and positions merge: the flat indices come from two small
    ops rather than the general path's eight (the usual decode step)."""
    batch, seqlen_new, capacity = k.shape[0], k.shape[1], k_cache.shape[1]
    rows = torch.arange(0, batch * capacity, capacity, device=k.device) + seqlens
    if seqlen_new > 1:
        rows = (rows[:, None] + torch.arange(seqlen_new, device=k.device)).flatten()
    for cache, new in ((k_cache, k), (v_cache, v)):
        cache.view(-1, *cache.shape[2:]).index_copy_(0, rows, new.reshape(-1, *new.shape[2:]))


def _check_room(positions, slots, k_cache, block_table, capacity):
    """The new tokens must land inside the cache (checked on CPU tensors in
    eager mode; on a GPU, as with flash-attn, and in a compiled graph that is
    the caller's duty: checking costs a host synchronisation per call)."""
    if positions.device.type != "cpu" or positions.numel() == 0 or torch.compiler.is_compiling():
        return
    if int(positions.max()) >= capacity or int(positions.min()) < 0:
        _fail(f"the new keys land at cache positions up to {int(positions.max())}, past the "
              f"cache's {capacity} positions: make room (a longer cache or more blocks)")
    if int(slots[0].max()) >= k_cache.shape[0] or int(slots[0].min()) < 0:
        what = "block_table names a block" if block_table is not None else "cache_batch_idx names a row"
        _fail(f"{what} outside k_cache's {k_cache.shape[0]}")


def _append_new(q, k, v, k_cache, v_cache, seqlens, k_end, rotary_cos, rotary_sin,
                rotary_interleaved, cache_leftpad, cache_batch_idx, block_table, alibi_slopes,
                softmax_scale, causal, window, softcap, num_splits) -> torch.Tensor:
    """The new keys and values (rotated with the tables, if given) written
    into the caches, once the library has accepted the call; returns q
    (rotated where rotary asks for it)."""
    if not torch.compiler.is_compiling():
        try:  # the library's verdict before the append changes the caches
            kvcache_check(q, k_cache, v_cache, k_end, k_start=cache_leftpad,
                          cache_batch_idx=cache_batch_idx, block_table=block_table,
                          alibi_slopes=alibi_slopes, scale=softmax_scale, causal=bool(causal),
                          window_size=window, softcap=softcap, num_splits=num_splits)
        except NativeError as exc:
            refuse(API, exc)
    batch, seqlen_new, page = q.shape[0], k.shape[1], k_cache.shape[1]
    capacity = block_table.shape[1] * page if block_table is not None else page
    dense = (rotary_cos is None and block_table is None and cache_batch_idx is None
             and _flat(k_cache) and _flat(v_cache))
    if dense and q.device.type != "cpu":  # on a GPU the caller answers for the room
        _append_dense(k_cache, v_cache, k, v, seqlens)
        return q
    positions = seqlens.long()[:, None]
    if seqlen_new > 1:
        positions = positions + torch.arange(seqlen_new, device=q.device)
    if rotary_cos is not None:
        # flash-attn rotates q per position when the attention is local
        local = bool(causal) or flash_attn_window(*window, capacity) != (-1, -1)
        k = apply_rotary(k, rotary_cos, rotary_sin, positions, rotary_interleaved)
        q_pos = seqlens.long()[:, None] + (torch.arange(q.shape[1], device=q.device)
                                           if local else 0)
        q = apply_rotary(q, rotary_cos, rotary_sin, q_pos.expand(batch, q.shape[1]),
                         rotary_interleaved)
    slots = _cache_slots(positions, cache_batch_idx, block_table, batch, page)
    _check_room(positions, slots, k_cache, block_table, capacity)
    if dense:  # the GPU's path, on the CPU after the room check
        _append_dense(k_cache, v_cache, k, v, seqlens)
    else:
        _append(k_cache, v_cache, k, v, slots)
    return q


def _on(t, device) -> bool:
    return t is None or (isinstance(t, torch.Tensor) and t.device == device)


def _plain_step(q, k_cache, v_cache, cache_seqlens, cache_leftpad, cache_batch_idx, block_table,
                alibi_slopes, window_size) -> bool:
    """A decode step the operator may take at once (a few microseconds of
    host time saved): no new keys (the caller checked), tensors of the API's
    ranks on q's device, the cache lengths a (batch,) vector (its dtype the
    library judges), a pair of window sides, and no gradient to keep out of."""
    Tensor = torch.Tensor
    if not (isinstance(q, Tensor) and isinstance(k_cache, Tensor) and isinstance(v_cache, Tensor)
            and isinstance(cache_seqlens, Tensor) and isinstance(window_size, (tuple, list))
            and len(window_size) == 2):
        return False
    device = q.device
    return (q.dim() == 4 and k_cache.dim() == 4 and v_cache.dim() == 4
            and cache_seqlens.dim() == 1 and k_cache.device == device
            and v_cache.device == device and cache_seqlens.device == device
            and _on(cache_leftpad, device) and _on(cache_batch_idx, device)
            and _on(block_table, device) and _on(alibi_slopes, device)
            and not (torch.is_grad_enabled() and (q.requires_grad or k_cache.requires_grad
                                                  or v_cache.requires_grad)))


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                            block_table=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """flash-attn 2.8's ``flash_attn_with_kvcache`` on our kernels (inference:
    no gradient).

    q: (batch, seqlen_q, nheads, headdim). k_cache, v_cache: (batch_cache,
    seqlen_cache, nheads_k, headdim), or with ``block_table`` (int32 (batch,
    max_num_blocks)) paged (num_blocks, page_block_size, nheads_k, headdim)
    with page_block_size a multiple of 16; nheads a multiple of nheads_k.
    ``cache_seqlens`` (int or int32 (batch,); None: the whole cache) is each
    batch's cache length; ``cache_batch_idx`` (int32 (batch,), dense caches
    only) the cache row each batch uses; ``cache_leftpad`` (int32 (batch,))
    where its keys start.

    ``k``, ``v`` (batch, seqlen_new, nheads_k, headdim), if given, are
    written into the caches in place at positions ``cache_seqlens`` ..
    ``cache_seqlens + seqlen_new - 1`` (through block_table when paged;
    the caches must have room: checked for CPU tensors only) and attended to.
    With ``rotary_cos``/``rotary_sin`` ((seqlen_ro, rotary_dim / 2)) the new
    keys are rotated at their positions before they are stored, and q at
    ``cache_seqlens + i`` when causal or windowed, else at ``cache_seqlens``
    (``rotary_interleaved``: GPT-J pairs (0, 1), (2, 3), ...; else GPT-NeoX
    pairs (i, i + rotary_dim / 2)). Append and rotary run as torch ops.

    Batch b attends to its keys ``cache_leftpad[b] .. cache_seqlens[b] +
    seqlen_new - 1``; with L of them, key j (counted from the first) is
    visible from query i iff ``i + L - seqlen_q - window_size[0] <= j <= i +
    L - seqlen_q + window_size[1]`` (-1: unbounded; ``causal``: right = 0).
    Scores ``softmax_scale * q.k`` (default 1/sqrt(headdim)); ``softcap >
    0``: ``softcap * tanh(score / softcap)``; ``alibi_slopes`` (fp32
    (nheads,) or (batch, nheads)) subtract ``slope * |i + L - seqlen_q -
    j|``. ``num_splits``: split the keys among that many programs (1: no
    split; 0: chosen from the GPU's compute units, for short queries).

    Returns out (batch, seqlen_q, nheads, headdim) and, with
    ``return_softmax_lse=True``, ``(out, softmax_lse)``, the fp32 (batch,
    nheads, seqlen_q) logsumexp of the scaled scores (+inf for a row that
    sees no key, whose output is 0).
    """
    if k is None and v is None and rotary_cos is None and rotary_sin is None and _plain_step(
            q, k_cache, v_cache, cache_seqlens, cache_leftpad, cache_batch_idx, block_table,
            alibi_slopes, window_size):
        try:
            out, lse = refusal_kept(flash_attn_kvcache, q, k_cache, v_cache, cache_seqlens,
                                    cache_leftpad, cache_batch_idx, block_table, alibi_slopes,
                                    softmax_scale, causal, window_size[0], window_size[1],
                                    softcap, num_splits, None, 0, API)
            return (out, lse) if return_softmax_lse else out
        except (TypeError, RuntimeError) as exc:
            if not schema_refused(exc):  # else the conversions and checks below
                raise
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            _fail(f"{name} must be a tensor, got {type(t).__name__}")
    if q.dim() != 4:
        _fail("q must be 4-D (batch, seqlen_q, nheads, headdim)")
    if k_cache.dim() != 4 or v_cache.dim() != 4:
        _fail("k_cache and v_cache must be 4-D")
    try:
        left, right = (operator.index(w) for w in window_size)
        num_splits = operator.index(num_splits)
    except (TypeError, ValueError):
        _fail(f"window_size must be a pair of ints and num_splits an int, got {window_size!r}, "
              f"{num_splits!r}")
    try:
        softcap = float(softcap)
    except (TypeError, ValueError):
        _fail(f"softcap must be a float, got {softcap!r}")
    batch = q.shape[0]
    paged = block_table is not None
    if paged and (not isinstance(block_table, torch.Tensor) or block_table.dim() != 2):
        _fail("block_table must be an int32 (batch, max_num_blocks) tensor")
    page = k_cache.shape[1]
    capacity = block_table.shape[1] * page if paged else page
    seqlen_new = _check_new(k, v, k_cache, batch)
    if seqlen_new and cache_seqlens is None:
        _fail("appending k/v needs cache_seqlens (where the new tokens go)")
    _check_rotary(rotary_cos, rotary_sin, q, seqlen_new > 0)
    seqlens = _seqlens(cache_seqlens, batch, capacity, q.device)
    k_end = seqlens if not seqlen_new else seqlens + seqlen_new
    check_operands(API, q, k_cache=k_cache, v_cache=v_cache, cache_leftpad=cache_leftpad,
                   cache_batch_idx=cache_batch_idx, block_table=block_table,
                   alibi_slopes=alibi_slopes)
    if seqlen_new:
        with torch.no_grad():
            q = _append_new(q, k, v, k_cache, v_cache, seqlens, k_end, rotary_cos, rotary_sin,
                            rotary_interleaved, cache_leftpad, cache_batch_idx, block_table,
                            alibi_slopes, softmax_scale, causal, (left, right), softcap,
                            num_splits)
    args = (q, k_cache, v_cache, k_end, cache_leftpad, cache_batch_idx, block_table, alibi_slopes,
            softmax_scale, bool(causal), left, right, softcap, num_splits, None, 0, API)
    if torch.is_grad_enabled() and (q.requires_grad or k_cache.requires_grad
                                    or v_cache.requires_grad):
        with torch.no_grad():  # inference only: outputs outside any graph
            out, lse = refusal_kept(flash_attn_kvcache, *args)
    else:
        out, lse = refusal_kept(flash_attn_kvcache, *args)
    return (out, lse) if return_softmax_lse else out


def varlen_paged_forward(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, block_table, softmax_scale, causal, window_size,
                         softcap=0.0, alibi_slopes=None):
    """flash_attn_varlen_func with ``block_table``: packed queries (total_q,
    H, D) against paged caches; sequence b's keys are the first
    ``cu_seqlens_k[b + 1] - cu_seqlens_k[b]`` positions of its pages.
    Returns (out, lse (H, total_q)), outside autograd (the caller attaches
    them: there is no backward); refusals name flash_attn_varlen_func."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1:
            fail(VARLEN_API, f"{name} must be a 1-D int32 tensor")
    if cu_seqlens_k.shape != cu_seqlens_q.shape:
        fail(VARLEN_API, "cu_seqlens_q and cu_seqlens_k must have the same length")
    if q.dim() != 3:
        fail(VARLEN_API, "q must be packed (total_q, nheads, headdim)")
    if not isinstance(block_table, torch.Tensor):
        fail(VARLEN_API, "block_table must be an int32 (batch, max_num_blocks) tensor")
    k_end = cu_seqlens_k.diff()
    capacity = block_table.shape[1] * k_cache.shape[1]
    window = flash_attn_window(*window_size, int(max_seqlen_k) or capacity)
    with torch.no_grad():
        return refusal_kept(flash_attn_kvcache, q, k_cache, v_cache, k_end, None, None,
                            block_table, alibi_slopes, softmax_scale, causal, *window, softcap, 0,
                            cu_seqlens_q, int(max_seqlen_q), VARLEN_API)
