"""Attention over a KV cache through ``attn_fwd_kvcache`` (kernels/flash_decode.py).

The one launcher behind :func:`aotriton_rocm.flash_attn_with_kvcache`,
``block_table`` in :func:`aotriton_rocm.flash_attn_varlen_func` and torch's
``_flash_attention_forward`` with ``seqused_k`` / ``block_table`` /
``num_splits``. Queries are flash-attn's (B, Sq, H, D) or packed (total_q,
H, D) with ``cu_seqlens_q``; the caches are dense (B_cache, S_cache, Hk, D)
or paged (num_blocks, page_size, Hk, D) with a ``block_table``; batch b
attends to the cache positions ``[k_start[b], k_end[b])``.

Split-KV: with ``num_splits > 1`` the keys of each query tile are shared by
that many programs, whose fp32 partial outputs and logsumexps the combine
kernel merges. ``num_splits = 0`` chooses: :func:`auto_num_splits` (the same
rule as libaotriton_rocm's ``aotr_attn_fwd_kvcache_splits``).
"""

from __future__ import annotations

import torch

from .attention import (INT32_MAX, default_scale, fresh_like, kernel_head_dim, meets_assumptions,
                        prepared, zero_padded)
from .interpreter_launch import launch_grid, placeholders
from .backends import KVCACHE_KERNELS, backend_for, kvcache_workspace_shapes as workspace_shapes
from .native import attn_window

# Head dims covered (1 to this; the kernels take multiples of 8, others run on
# zero-padded copies, caches included), and the dtypes.
MAX_HEAD_DIM = 256
DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
# Page sizes are multiples of this (the kernels' row vectors stay aligned).
PAGE_MULTIPLE = 16
MAX_SPLITS = 128
# Compute units the CPU interpreter pretends to have (only the split choice
# depends on it).
CPU_COMPUTE_UNITS = 8


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def auto_num_splits(batch: int, heads_k: int, rows: int, seqlen_k: int, block_m: int,
                    block_n: int, compute_units: int) -> int:
    """Splits for ``num_splits = 0`` (libaotriton_rocm's rule, see
    ``aotr_attn_fwd_kvcache_splits``): 1 unless the (batch, key/value head,
    row block) programs leave most compute units idle; then enough splits
    for about two programs per compute unit, each split keeping at least 4
    key blocks, at most :data:`MAX_SPLITS`. ``rows``: query rows x GQA group
    (the packed rows of one key/value head); ``block_m``/``block_n``: the
    kernel's tiles; ``seqlen_k``: the cache's capacity."""
    programs = batch * heads_k * _cdiv(rows, block_m)
    if compute_units <= 0 or programs == 0 or programs * 5 >= compute_units * 4:
        return 1
    want = _cdiv(2 * compute_units, programs)
    return max(1, min(want, _cdiv(seqlen_k, block_n) // 4, MAX_SPLITS))


def compute_units(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_COMPUTE_UNITS


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
        reason = backend.unsupported_reason(kernel, dtype=dtype, head_dim=kernel_head_dim(d))
        if reason:
            return reason
    return None


def _named_bshd(prefix: str, t: torch.Tensor, row: str = "m") -> dict[str, int]:
    """``stride_<prefix>z/h/<row>`` of a (B, S, H, D) tensor; packed (total,
    H, D): no z stride."""
    s = t.stride()
    strides = (s[0], s[2], s[1]) if t.dim() == 4 else (0, s[1], s[0])
    return dict(zip((f"stride_{prefix}z", f"stride_{prefix}h", f"stride_{prefix}{row}"),
                    strides))


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
    if q.shape[-1] % 8:
        # The kernels read head dims in runs of 8: run them on zero-padded
        # copies (of the whole caches: a cache with such a head dim is copied
        # on every call).
        d = q.shape[-1]
        if out is None:
            out = torch.empty_like(q)
        qp, kc, vc = (zero_padded(t, kernel_head_dim(d)) for t in (q, k_cache, v_cache))
        o, lse, splits = forward(
            qp, kc, vc, k_end, k_start=k_start, cache_batch_idx=cache_batch_idx,
            block_table=block_table, alibi_slopes=alibi_slopes,
            scale=default_scale(d) if scale is None else scale, causal=causal,
            window_size=window_size, softcap=softcap, num_splits=num_splits,
            cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, out=fresh_like(qp))
        out.copy_(o[..., :d])
        return out, lse, splits
    varlen = cu_seqlens_q is not None
    b = cu_seqlens_q.numel() - 1 if varlen else q.shape[0]
    sq = int(max_seqlen_q) if varlen else q.shape[1]
    h, d = q.shape[-2], q.shape[-1]
    hk = k_cache.shape[2]
    if out is None:
        out = torch.empty_like(q)
    lse = torch.empty((h, q.shape[0]) if varlen else (b, h, sq), dtype=torch.float32,
                      device=q.device)
    if b * h * sq == 0 or q.numel() == 0:
        lse.fill_(float("inf"))
        return out, lse, 1
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    left, right = attn_window(*window_size, causal, capacity)
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
    if backend.native:
        _, _, splits = backend.forward_kvcache(
            q_k, kc, vc, o, lse, k_end=k_end, k_start=k_start,
            cache_batch_idx=cache_batch_idx, block_table=block_table, alibi_slopes=alibi_slopes,
            cu_seqlens_q=cu_seqlens_q, max_seqlen_q=sq, scale=sm_scale, window=(left, right),
            softcap=float(softcap), num_splits=int(num_splits))
        if o is not out:
            out.copy_(o)
        return out, lse, splits
    dtype = DTYPES[q.dtype]
    main = backend.kernel("attn_fwd_kvcache", dtype=dtype, head_dim=d, seqlen_q=sq)
    if num_splits <= 0:
        num_splits = auto_num_splits(b, hk, sq * (h // hk), capacity, main.config["BLOCK_M"],
                                     main.config["BLOCK_N"], compute_units(q.device))
    num_splits = max(1, min(int(num_splits), MAX_SPLITS))
    spare = placeholders(q.device, q.dtype)
    cu = spare["cu"]
    part_o = part_lse = torch.zeros(16, dtype=torch.float32, device=q.device)
    if num_splits > 1:
        o_shape, l_shape = workspace_shapes(b, h, num_splits, sq, d)
        part_o = torch.empty(o_shape, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(l_shape, dtype=torch.float32, device=q.device)
    lse_strides = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
    alibi = spare["values"].float() if alibi_slopes is None else alibi_slopes
    stride_az = 0 if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes.stride(0)
    rows = sq * (h // hk)
    cu_q = cu if not varlen else cu_seqlens_q
    main.launch(launch_grid(_cdiv(rows, main.config["BLOCK_M"]) * num_splits, b * hk),
                q.device, dict(
        Q=q_k, K=kc, V=vc, O=o, LSE=lse, O_PART=part_o, LSE_PART=part_lse, CU_Q=cu_q,
        K_START=cu if k_start is None else k_start, K_END=k_end,
        CACHE_BATCH_IDX=cu if cache_batch_idx is None else cache_batch_idx,
        BLOCK_TABLE=cu if block_table is None else block_table, ALIBI=alibi,
        **_named_bshd("q", q_k), **_named_bshd("k", kc, "n"), **_named_bshd("v", vc, "n"),
        **_named_bshd("o", o), stride_lz=lse_strides[0], stride_lh=lse_strides[1],
        stride_btz=0 if block_table is None else block_table.stride(0), stride_az=stride_az,
        batch=b, num_heads=h, gqa_group=h // hk, max_seqlen_q=sq, varlen=int(varlen),
        head_dim=d, paged=int(paged), page_size=k_cache.shape[1] if paged else 1,
        has_batch_idx=int(cache_batch_idx is not None), has_k_start=int(k_start is not None),
        has_alibi=int(alibi_slopes is not None), window_left=left, window_right=right,
        sm_scale=sm_scale, softcap=float(softcap), num_splits=num_splits))
    if num_splits > 1:
        comb = backend.kernel("attn_fwd_kvcache_combine", dtype=dtype, head_dim=d, seqlen_q=sq)
        comb.launch(launch_grid(_cdiv(sq, comb.config["BLOCK_M"]), b * h), q.device, dict(
            O_PART=part_o, LSE_PART=part_lse, O=o, LSE=lse, CU_Q=cu_q, **_named_bshd("o", o),
            stride_lz=lse_strides[0], stride_lh=lse_strides[1], batch=b, num_heads=h,
            max_seqlen_q=sq, varlen=int(varlen), head_dim=d, num_splits=num_splits))
    if o is not out:
        out.copy_(o)
    return out, lse, num_splits
