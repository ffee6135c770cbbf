"""Attention over a KV cache (flash-attn's ``flash_attn_with_kvcache``), with
split-KV (flash-decoding) for short queries against long caches.

Compiled ahead of time like ``flash_attention.py`` (see its docstring for the
conventions this file shares: program ids, int64 base offsets, the log2
domain, fp32 element-wise math, ``UPCAST_DOT`` for the CPU interpreter,
reductions through ``tl.reduce``, integer division only on non-negative
values) and described in ``kernels/variants.toml``.

Layouts (flash-attn's): Q and O are (batch, seqlen_q, heads, head_dim)
addressed by (z, h, row) strides, or packed (total_q, heads, head_dim) rows
``CU_Q[z] .. CU_Q[z + 1]`` with ``varlen != 0`` (no z stride). The caches K
and V are addressed by (block, head, row) strides:

* dense (``paged == 0``): (batch_cache, seqlen_cache, heads_k, head_dim);
  batch z reads cache row ``CACHE_BATCH_IDX[z]`` (``has_batch_idx``) or z;
* paged (``paged != 0``): (num_blocks, page_size, heads_k, head_dim); key
  position n of batch z lives in page ``BLOCK_TABLE[z, n // page_size]``,
  row ``n % page_size`` (page_size a multiple of 16; any number of pages).

Batch z attends to the cache positions ``[K_START[z], K_END[z])``
(``K_START`` is flash-attn's ``cache_leftpad``, 0 without ``has_k_start``;
``K_END`` the cache length after the append). Masks and ALiBi use the
positions relative to ``K_START``: with ``L = K_END[z] - K_START[z]`` and
``Sq`` this sequence's queries, key j (relative) is visible from query i iff
``i + L - Sq - window_left <= j <= i + L - Sq + window_right`` (a negative
size: unbounded; causal is ``window_right = 0``): bottom-right alignment, as
flash-attn. Rows that see no key get output 0 and LSE +inf.

Scores: ``s = sm_scale * q.k``; with ``softcap > 0`` ``s = softcap *
tanh(s / softcap)``; with ``has_alibi`` ``s -= slope * |i + L - Sq - j|``,
the slope read from ``ALIBI[z * stride_az + h]`` (fp32, (H,) with
``stride_az = 0`` or (B, H)). All runtime arguments: :func:`kvcache_score`
holds the score code.

GQA packing: one program serves one key/value head and all ``gqa_group``
query heads that read it: its tile rows are the (query row i, group member g)
pairs ``r = i * gqa_group + g`` of this sequence, so the cache is read once
per key/value head (decoding with GQA reads each key block once, not once
per query head).

Split-KV: ``num_splits`` programs share the keys of one tile: split s walks
its share of the tile's visible key blocks. With ``num_splits == 1`` the
program writes O and LSE itself. Otherwise it writes fp32 partials to the
workspace, contiguous ``O_PART (batch, heads, num_splits, max_seqlen_q,
head_dim)`` (normalised by the split's own row sum) and ``LSE_PART (batch,
heads, num_splits, max_seqlen_q)`` (-inf where the split saw no key), and
``attn_fwd_kvcache_combine`` merges them into O and LSE.

Grid: ``(cdiv(max_seqlen_q * gqa_group, BLOCK_M) * num_splits, min(batch *
heads_k, 65535), cdiv(batch * heads_k, 65535))``; program id 0 is
``row_block * num_splits + split``.

The head dim is always masked (``d < head_dim``, written so that Triton knows
the mask comes in runs of 8): the kernel is bound by reading the cache, and
one variant per padded width is enough.

The CPU interpreter runs the nested ``@triton.jit`` helpers (the one below
and the prologue helpers of ``flash_attention``) as nested calls: the
interpreter backend imports these sources with the interpreter on (see
``aotriton_rocm.kernel_spec.interpreted_function``).
"""

import triton
import triton.language as tl

from .flash_attention import packed_rows, program_batch_head, row_masks
from .score_mod import softcap_scores

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2)


@triton.jit
def kvcache_score(qk, sm_scale, softcap, has_alibi, slope, dist):
    """Scores in natural-log units from the raw dot products ``qk``: scaled,
    soft-capped (``score_mod.softcap_scores``) and, with
    ``has_alibi``, lowered by ``slope * dist`` (``dist = |i + L - Sq - j|``,
    ``slope`` per row)."""
    s = qk * sm_scale
    if softcap > 0.0:
        s = softcap_scores(s, softcap)
    if has_alibi != 0:
        s = s - slope[:, None] * dist
    return s


@triton.jit
def attn_fwd_kvcache(
    Q, K, V, O, LSE, O_PART, LSE_PART, CU_Q, K_START, K_END, CACHE_BATCH_IDX, BLOCK_TABLE, ALIBI,
    stride_qz, stride_qh, stride_qm,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_oz, stride_oh, stride_om,
    stride_lz, stride_lh,
    stride_btz, stride_az,
    batch, num_heads, gqa_group, max_seqlen_q, varlen, head_dim,
    paged, page_size, has_batch_idx, has_k_start, has_alibi,
    window_left, window_right, sm_scale, softcap, num_splits,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    pid0 = tl.program_id(0)
    split = pid0 % num_splits
    start_r = (pid0 // num_splits) * BLOCK_M
    _, off_z32, off_hk32 = program_batch_head(num_heads, gqa_group)
    z_last = tl.minimum(off_z32, batch - 1)
    off_z = z_last.to(tl.int64)

    # This program's queries and keys.
    q_start, seqlen_q = packed_rows(CU_Q, z_last, batch, max_seqlen_q, varlen, 0)
    k_first = tl.load(K_START + z_last, mask=has_k_start != 0, other=0)
    seqlen_k = tl.maximum(tl.load(K_END + z_last) - k_first, 0)
    rows_total = tl.where(off_z32 < batch, seqlen_q * gqa_group, 0)
    seqlen_k = tl.where(start_r < rows_total, seqlen_k, 0)
    cache_row = tl.load(CACHE_BATCH_IDX + z_last, mask=has_batch_idx != 0, other=0)
    cache_row = tl.where(has_batch_idx != 0, cache_row, z_last).to(tl.int64)

    # Tile rows: (query row i, group member g) pairs.
    offs_r = start_r + tl.arange(0, BLOCK_M)
    r_valid = offs_r < rows_total
    row_i = offs_r // gqa_group
    off_h = off_hk32 * gqa_group + offs_r % gqa_group
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < (head_dim // 8) * 8  # == head_dim; the form tells Triton masks come in runs of 8
    q_mask = r_valid[:, None] & d_valid[None, :]

    q_rows = (q_start + row_i).to(tl.int64) * stride_qm.to(tl.int64) \
        + off_h.to(tl.int64) * stride_qh.to(tl.int64)
    q = tl.load(Q + off_z * stride_qz.to(tl.int64) + (q_rows[:, None] + offs_d[None, :]),
                mask=q_mask, other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)
    # (Masks that combine a vector with a scalar flag are written as one
    # vector comparison: the interpreter cannot load with the other form.)
    slope = tl.load(ALIBI + off_z * stride_az + off_h,
                    mask=offs_r < tl.where(has_alibi != 0, rows_total, 0), other=0.0)

    # Row i sees relative keys [i + lo_shift, i + hi_shift] (module docstring).
    shift = seqlen_k - seqlen_q
    hi_shift = tl.where(window_right < 0, seqlen_k, shift + window_right)
    lo_shift = tl.where(window_left < 0, -seqlen_q, shift - window_left)
    i_first = start_r // gqa_group
    i_last = tl.minimum((start_r + BLOCK_M - 1) // gqa_group, tl.maximum(seqlen_q - 1, 0))
    kv_lo = (tl.maximum(i_first + lo_shift, 0) // BLOCK_N) * BLOCK_N
    kv_hi = tl.maximum(tl.minimum(i_last + hi_shift + 1, seqlen_k), kv_lo)
    # This split's share of the tile's key blocks.
    per_split = ((kv_hi - kv_lo + BLOCK_N - 1) // BLOCK_N + num_splits - 1) // num_splits * BLOCK_N
    lo = tl.minimum(kv_lo + split * per_split, kv_hi)
    hi = tl.minimum(lo + per_split, kv_hi)

    k_head = K + off_hk32.to(tl.int64) * stride_kh.to(tl.int64)
    v_head = V + off_hk32.to(tl.int64) * stride_vh.to(tl.int64)
    bt_row = BLOCK_TABLE + off_z * stride_btz.to(tl.int64)
    is_paged = paged != 0
    paged_len = tl.where(is_paged, seqlen_k, 0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    diag = row_i + shift  # the key each row is aligned with (ALiBi distance 0)

    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        n_valid = cols < seqlen_k
        # Cache rows of these keys: (page or cache row, row inside it).
        pos = k_first + cols
        page = tl.load(bt_row + pos // page_size, mask=cols < paged_len, other=0)
        block = tl.where(is_paged, page.to(tl.int64), cache_row)
        inner = tl.where(is_paged, pos % page_size, pos).to(tl.int64)
        kv_mask = n_valid[:, None] & d_valid[None, :]
        k_rows = block * stride_kz.to(tl.int64) + inner * stride_kn.to(tl.int64)
        k = tl.load(k_head + (k_rows[:, None] + offs_d[None, :]), mask=kv_mask, other=0.0)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        dist = tl.abs(diag[:, None] - cols[None, :]).to(tl.float32)
        s = kvcache_score(qk, sm_scale, softcap, has_alibi, slope, dist) * LOG2E
        keep = n_valid[None, :] & (cols[None, :] <= (row_i + hi_shift)[:, None]) \
            & (cols[None, :] >= (row_i + lo_shift)[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
        # A row that has seen no key yet: shift by 0, so that p = alpha = 0, not NaN.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        acc = acc * alpha[:, None]
        v_rows = block * stride_vz.to(tl.int64) + inner * stride_vn.to(tl.int64)
        v = tl.load(v_head + (v_rows[:, None] + offs_d[None, :]), mask=kv_mask, other=0.0)
        p_lp = p.to(V.dtype.element_ty)
        if UPCAST_DOT:
            p_lp = p_lp.to(tl.float32)
            v = v.to(tl.float32)
        acc = tl.dot(p_lp, v, acc, input_precision="ieee")
        m_i = m_new

    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc * (1.0 / l_safe)[:, None]
    lse2 = m_i + tl.math.log2(l_safe)  # log2 domain
    if num_splits == 1:
        o_rows = (q_start + row_i).to(tl.int64) * stride_om.to(tl.int64) \
            + off_h.to(tl.int64) * stride_oh.to(tl.int64)
        tl.store(O + off_z * stride_oz.to(tl.int64) + (o_rows[:, None] + offs_d[None, :]),
                 acc.to(O.dtype.element_ty), mask=q_mask)
        lse_rows = off_z * stride_lz + off_h.to(tl.int64) * stride_lh + q_start + row_i
        tl.store(LSE + lse_rows, tl.where(empty, float("inf"), lse2 * LN2), mask=r_valid)
    else:
        # Partials: row (z, h, split, i) of the workspace.
        part = ((off_z * num_heads + off_h) * num_splits + split) * max_seqlen_q + row_i
        tl.store(LSE_PART + part, tl.where(empty, float("-inf"), lse2 * LN2), mask=r_valid)
        tl.store(O_PART + (part[:, None] * head_dim + offs_d[None, :]), acc, mask=q_mask)


@triton.jit
def attn_fwd_kvcache_combine(
    O_PART, LSE_PART, O, LSE, CU_Q,
    stride_oz, stride_oh, stride_om,
    stride_lz, stride_lh,
    batch, num_heads, max_seqlen_q, varlen, head_dim, num_splits,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """O and LSE from the split partials of ``attn_fwd_kvcache``: LSE =
    log(sum_s exp(LSE_s)), O = sum_s exp(LSE_s - LSE) O_s (rows no split saw
    a key of: O = 0, LSE = +inf). Grid: (cdiv(max_seqlen_q, BLOCK_M),
    min(batch * heads, 65535), cdiv(batch * heads, 65535))."""
    start_m = tl.program_id(0) * BLOCK_M
    _, off_z32, off_h32 = program_batch_head(num_heads, 1)
    z_last = tl.minimum(off_z32, batch - 1)
    off_z = z_last.to(tl.int64)
    off_h = off_h32.to(tl.int64)
    q_start, seqlen_q = packed_rows(CU_Q, z_last, batch, max_seqlen_q, varlen, 0)
    seqlen_q = tl.where(off_z32 < batch, seqlen_q, 0)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d, m_valid, _, mask = row_masks(offs_m, seqlen_q, head_dim, BLOCK_D, True)
    first = (off_z * num_heads + off_h) * num_splits * max_seqlen_q + offs_m

    lse_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in range(0, num_splits):
        lse_s = tl.load(LSE_PART + first + s * max_seqlen_q, mask=m_valid, other=float("-inf"))
        lse_max = tl.maximum(lse_max, lse_s)
    m_use = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    total = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    for s in range(0, num_splits):
        row = first + s * max_seqlen_q
        w = tl.math.exp2((tl.load(LSE_PART + row, mask=m_valid, other=float("-inf")) - m_use)
                         * LOG2E)
        o_s = tl.load(O_PART + (row[:, None] * head_dim + offs_d[None, :]), mask=mask, other=0.0)
        total = total + w
        acc = acc + w[:, None] * o_s
    empty = total == 0.0
    t_safe = tl.where(empty, 1.0, total)
    acc = acc * (1.0 / t_safe)[:, None]
    lse = tl.where(empty, float("inf"), m_use + tl.math.log2(t_safe) * LN2)
    rows = (q_start + offs_m).to(tl.int64)
    o_ptrs = O + off_z * stride_oz.to(tl.int64) + off_h * stride_oh.to(tl.int64) \
        + (rows[:, None] * stride_om.to(tl.int64) + offs_d[None, :])
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=mask)
    tl.store(LSE + off_z * stride_lz + off_h * stride_lh + q_start + offs_m, lse, mask=m_valid)
