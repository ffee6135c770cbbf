"""Attention over a KV cache through ``attn_fwd_kvcache`` (kernels/flash_decode.py).

The Python route behind :func:`aotriton_rocm.flash_attn_with_kvcache`,
``block_table`` in :func:`aotriton_rocm.flash_attn_varlen_func` and torch's
``_flash_attention_forward`` with ``seqused_k`` / ``block_table`` /
``num_splits``. Queries are flash-attn's (B, Sq, H, D) or packed (total_q,
H, D) with ``cu_seqlens_q``; the caches are dense (B_cache, S_cache, Hk, D)
or paged (num_blocks, page_size, Hk, D) with a ``block_table``; batch b
attends to the cache positions ``[k_start[b], k_end[b])``.

Split-KV: with ``num_splits > 1`` the keys of each query tile are shared by
that many programs, whose fp32 partial outputs and logsumexps the combine
kernel merges. ``num_splits = 0``: libaotriton_rocm chooses
(``aotr_attn_fwd_kvcache_splits``), on every backend.
"""

from __future__ import annotations

import torch

from .attention import INT32_MAX, default_scale, fresh_like, meets_assumptions, prepared
from .backends import KVCACHE_KERNELS, backend_for

# Head dims covered (1 to this; the kernels take multiples of 8, others run on
# zero-padded copies, caches included), and the dtypes.
MAX_HEAD_DIM = 256
DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
# Page sizes are multiples of this (the kernels' row vectors stay aligned).
PAGE_MULTIPLE = 16
def _int32_vector(name: str, t, batch: int, device) -> str | None:
    if not isinstance(t, torch.Tensor):
        return f"{name} must be an int32 tensor"
    if t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] != batch:
        return f"{name} must be an int32 tensor of shape (batch,) = ({batch},), got {t.dtype} {tuple(t.shape)}"
    if t.device != device:
        return f"{name} must be on the query's device ({device})"
    return None


def unsupported_reason(q, k_cache, v_cache, *, k_end, k_start=None, cache_batch_idx=None,
                       block_table=None, alibi_slopes=None, cu_seqlens_q=None) -> str | None:
    """Why the KV-cache kernels cannot run this call, or None."""
    varlen = cu_seqlens_q is not None
    rank = 3 if varlen else 4
    if q.dim() != rank:
        return ("q must be 3-D packed (total_q, nheads, headdim) with cu_seqlens_q" if varlen
                else "q must be 4-D (batch, seqlen_q, nheads, headdim)")
    if k_cache.dim() != 4 or v_cache.dim() != 4:
        return ("k_cache and v_cache must be 4-D: (batch_cache, seqlen_cache, nheads_k, headdim), "
                "or (num_blocks, page_block_size, nheads_k, headdim) with block_table")
    if k_cache.shape != v_cache.shape:
        return f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape"
    if q.dtype not in DTYPES:
        return f"dtype {q.dtype} is not covered (fp16 and bf16 are)"
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        return "q, k_cache and v_cache must share a dtype"
    if k_cache.device != q.device or v_cache.device != q.device:
        return "q, k_cache and v_cache must be on one device"
    d, h, hk = q.shape[-1], q.shape[-2], k_cache.shape[2]
    if k_cache.shape[3] != d:
        return f"k_cache's headdim ({k_cache.shape[3]}) differs from q's ({d})"
    if not 1 <= d <= MAX_HEAD_DIM:
        return f"headdim {d} is not covered (1 to {MAX_HEAD_DIM} are)"
    if hk == 0 or h % hk:
        return f"nheads ({h}) must be a multiple of nheads_k ({hk})"
    batch = cu_seqlens_q.numel() - 1 if varlen else q.shape[0]
    if varlen:
        cu = cu_seqlens_q
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 1 or cu.device != q.device:
            return "cu_seqlens_q must be a 1-D int32 tensor (batch + 1) on the query's device"
    for name, t in (("cache_seqlens", k_end), ("cache_leftpad", k_start),
                    ("cache_batch_idx", cache_batch_idx)):
        if t is not None:
            reason = _int32_vector(name, t, batch, q.device)
            if reason:
                return reason
    if block_table is not None:
        if cache_batch_idx is not None:
            return "cache_batch_idx cannot be used with block_table (a paged cache)"
        bt = block_table
        if bt.dtype != torch.int32 or bt.dim() != 2 or bt.shape[0] != batch or bt.device != q.device:
            return (f"block_table must be an int32 (batch, max_num_blocks) = ({batch}, ...) tensor "
                    f"on the query's device, got {bt.dtype} {tuple(bt.shape)}")
        if bt.stride(1) != 1 and bt.shape[1] > 1:
            return "block_table needs a unit stride along its blocks"
        page = k_cache.shape[1]
        if page % PAGE_MULTIPLE or page == 0:
            return (f"the page size (k_cache.shape[1] = {page}) must be a positive multiple of "
                    f"{PAGE_MULTIPLE}")
    elif cache_batch_idx is None and k_cache.shape[0] < batch:
        return f"k_cache holds {k_cache.shape[0]} batch rows, the query {batch}"
    if alibi_slopes is not None:
        a = alibi_slopes
        if a.dtype != torch.float32 or a.device != q.device or a.shape not in ((h,), (batch, h)):
            return (f"alibi_slopes must be fp32 of shape (nheads,) or (batch, nheads) = ({h},) or "
                    f"({batch}, {h}), got {a.dtype} {tuple(a.shape)}")
        if a.stride(-1) != 1:
            return "alibi_slopes needs a unit last stride"
    for t in (q, k_cache, v_cache):
        if max(t.stride(), default=0) > INT32_MAX:
            return "strides too large for the kernels' 32-bit stride arguments"
    backend = backend_for(q)
    if backend is None:
        return f"no backend for device {q.device}"
    dtype = DTYPES[q.dtype]
    for kernel in KVCACHE_KERNELS:
        reason = backend.unsupported_reason(kernel, dtype=dtype, head_dim=d)
        if reason:
            return reason
    return None


def forward(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_end: torch.Tensor,
            *, k_start: torch.Tensor | None = None, cache_batch_idx: torch.Tensor | None = None,
            block_table: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
            scale: float | None = None, causal: bool = False,
            window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, num_splits: int = 0,
            cu_seqlens_q: torch.Tensor | None = None, max_seqlen_q: int = 0,
            out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(out like q, fp32 logsumexp, the number of splits used).

    The logsumexp is (B, H, Sq), or (H, total_q) with ``cu_seqlens_q``. The
    caller has checked :func:`unsupported_reason`; ``window_size`` is
    flash-attn's (-1: unbounded; ``causal`` sets the right side to 0),
    aligned bottom-right with each batch's key range.
    """
    varlen = cu_seqlens_q is not None
    b = cu_seqlens_q.numel() - 1 if varlen else q.shape[0]
    sq = int(max_seqlen_q) if varlen else q.shape[1]
    h, d = q.shape[-2], q.shape[-1]
    if out is None:
        out = torch.empty_like(q)
    lse = torch.empty((h, q.shape[0]) if varlen else (b, h, sq), dtype=torch.float32,
                      device=q.device)
    if b * h * sq == 0 or q.numel() == 0:
        lse.fill_(float("inf"))
        return out, lse, 1
    sm_scale = default_scale(d) if scale is None else float(scale)
    backend = backend_for(q)
    # Tensors the kernels read in place (copies where the layout does not
    # meet their assumptions; the caches only then: a large cache should be
    # laid out so that it does), unit-stride index vectors.
    q_k, kc, vc = (prepared(t) for t in (q, k_cache, v_cache))
    o = out if meets_assumptions(out) else fresh_like(out)
    k_end, k_start, cache_batch_idx, block_table, alibi_slopes = (
        None if t is None else t.contiguous()
        for t in (k_end, k_start, cache_batch_idx, block_table, alibi_slopes))
    _, _, splits = backend.forward_kvcache(
        q_k, kc, vc, o, lse, k_end=k_end, k_start=k_start, cache_batch_idx=cache_batch_idx,
        block_table=block_table, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
        max_seqlen_q=sq, scale=sm_scale, window=window_size, causal=causal, softcap=float(softcap),
        num_splits=int(num_splits))
    if o is not out:
        out.copy_(o)
    return out, lse, splits
