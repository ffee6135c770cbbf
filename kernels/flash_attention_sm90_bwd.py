"""The backward's dK/dV kernel for sm_90 in Gluon: warp-specialised, one
warpgroup per gradient.

``attn_bwd_dkdv`` here takes the argument list of
``flash_attention.attn_bwd_dkdv`` and computes the same thing for its
unmasked fast-path variants (``PAD_HEAD``, ``HAS_BIAS``, ``ENABLE_DROPOUT``,
``SPLIT_DKDV`` and ``UPCAST_DOT`` off, so no softcap or ALiBi either; fp16/bf16;
causal, sliding windows, varlen, GQA and ragged ends as runtime arguments, see
that module's docstring). variants.toml compiles it for sm_90 through a config with
``function = "flash_attention_sm90_bwd:attn_bwd_dkdv"``; AMD archs and the CPU
interpreter run the Triton kernel. dQ stays with ``flash_attention.attn_bwd_dq``.

Why it exists: at head dim 256 the Triton kernel cannot hold the two
(BLOCK_N, 256) fp32 accumulators of dK and dV in one warpgroup's registers;
it sweeps the query blocks twice (dV, then dK) and still spills. Here, per
CTA of BLOCK_N = 64 keys and in steps of BLOCK_M = 64 queries:

* a producer warpgroup (``_producer``) copies K and V once, then Q_i and dO_i
  of each query block into two-slot rings by TMA (3-D descriptors over the
  GQA group's heads, built on the device per sequence, so TMA zero-fills the
  rows past the sequence's end);
* the dV warpgroup (``_dv_consumer``) computes S^T = K Q_i^T, P^T from the
  forward's LSE (and the masks), hands P^T to the other
  warpgroup through shared memory, and accumulates dV += P^T dO_i;
* the dK warpgroup (``_dk_consumer``) computes dP^T = V dO_i^T, takes P^T,
  forms dS^T = P^T (dP^T - delta) and accumulates dK += dS^T Q_i.

Each warpgroup owns one (BLOCK_N, BLOCK_D) accumulator and two of the four
products, so nothing is computed twice. Within a warpgroup the products of
consecutive query blocks overlap as in the Gluon forward: block i's first
product is issued before block i-1's accumulation, and the element-wise work
of block i runs while that accumulation does. Block order: the GQA group's
heads, each with its unmasked query blocks first, then the masked ones (see
``flash_attention.query_block_ranges``); block ``t`` counted over all of them
uses ring slot ``t % 2`` with mbarrier parity ``(t // 2) & 1``.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .flash_attention import LOG2E, key_program_sequence, program_batch_head, query_block_ranges, row_ptr
from .flash_attention_sm90 import TMA_LOAD, _block_start, _rows_descriptor

# a CTA-wide barrier of the calling partition: gl.barrier from triton 3.9, the older name before
BARRIER = getattr(gl, "barrier", None) or gl.thread_barrier
SLOTS = gl.constexpr(2)  # ring depth of Q, dO and P^T (head dim 256: K, V 64 + Q, dO 128 + P^T 32 KiB)
PRODUCER_WARPS = gl.constexpr(4)
# 2 x 128 x 240 + 128 x 24 <= 65536 registers (the producer only issues copies)
PRODUCER_REGS = gl.constexpr(24)
CONSUMER_REGS = gl.constexpr(240)


@gluon.jit
def _key_block(CU_Q, CU_K, batch, num_heads, gqa_group, max_seqlen_q, max_seqlen_k, varlen, bottom_right,
               window_left, window_right, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """This program's key block: its first key, batch entry and key head, the
    sequence's bounds (seqlen_q is 0 for a block past the keys, seqlen_k 0
    past the batch) and its query block ranges (``query_block_ranges``)."""
    start_n = gl.program_id(0) * BLOCK_N
    _, off_z, off_hk = program_batch_head(num_heads, gqa_group)
    _, q_start, k_start, seqlen_q, seqlen_k, causal_shift, _ = key_program_sequence(
        CU_Q, CU_K, off_z, start_n, batch, max_seqlen_q, max_seqlen_k, varlen, bottom_right)
    lo_shift, hi_shift, lo, up, f_lo, f_hi = query_block_ranges(
        start_n, seqlen_q, seqlen_k, causal_shift, window_left, window_right, BLOCK_M, BLOCK_N)
    return start_n, off_z, off_hk, q_start, k_start, seqlen_q, seqlen_k, lo_shift, hi_shift, lo, up, f_lo, f_hi


@gluon.jit
def _ring_wait(bar, t, EMPTY: gl.constexpr):
    NB: gl.constexpr = bar.shape[0]
    if EMPTY:  # the first pass over a fresh slot does not wait
        mbarrier.wait(bar.index(t % NB), ((t // NB) & 1) ^ 1)
    else:
        mbarrier.wait(bar.index(t % NB), (t // NB) & 1)


@gluon.jit
def _group_descriptor(base, heads, rows, stride_h, stride_row, box):
    # heads x rows x head dim from base, copied one head's (1, rows, head dim)
    # box at a time; TMA reads zeros past the last row
    return tma.make_tensor_descriptor(base, [heads, gl.maximum(rows, 1), box.shape[2]], [stride_h, stride_row, 1],
                                      box.shape, box.type.layout)


@gluon.jit
def _box(smem):
    # a (rows, cols) ring slot as the (1, rows, cols) box of a 3-D descriptor
    return smem.reshape([1, smem.shape[0], smem.shape[1]])


@gluon.jit
def _query_blocks(q_desc, do_desc, q_smem, do_smem, bars, g, lo_p, up_p, f_lo, f_hi, t, MASKED: gl.constexpr):
    q_ready, do_ready, qdo_empty = bars
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    nbytes: gl.constexpr = q_smem.shape[1] * q_smem.shape[2] * q_smem.dtype.primitive_bitwidth // 8
    for x in range(lo_p, up_p, BLOCK_M):
        m = _block_start(x, f_lo, f_hi, MASKED)
        slot = t % q_smem.shape[0]
        _ring_wait(qdo_empty, t, True)
        mbarrier.expect(q_ready.index(slot), nbytes)
        TMA_LOAD(q_desc, [g, m, 0], q_ready.index(slot), _box(q_smem.index(slot)))
        mbarrier.expect(do_ready.index(slot), nbytes)
        TMA_LOAD(do_desc, [g, m, 0], do_ready.index(slot), _box(do_smem.index(slot)))
        t += 1
    return t


@gluon.jit
def _producer(k_smem, v_smem, q_smem, do_smem, kv_bar, bars, k_base, v_base, stride_kn, stride_vn, q_base, do_base,
              stride_qh, stride_qm, stride_doh, stride_dom, start_n, seqlen_q, seqlen_k, gqa_group,
              lo, up, f_lo, f_hi):
    # A key block past its sequence's rows copies nothing (its base may be the
    # tensor's end) and completes kv_bar by a plain arrival.
    live = start_n < seqlen_k
    k_desc = _rows_descriptor(k_base, seqlen_k, stride_kn, k_smem)
    v_desc = _rows_descriptor(v_base, seqlen_k, stride_vn, v_smem)
    mbarrier.expect(kv_bar, 2 * k_smem.shape[0] * k_smem.shape[1] * k_smem.dtype.primitive_bitwidth // 8, pred=live)
    TMA_LOAD(k_desc, [start_n, 0], kv_bar, k_smem, pred=live)
    TMA_LOAD(v_desc, [start_n, 0], kv_bar, v_smem, pred=live)
    mbarrier.arrive(kv_bar, count=1, pred=start_n >= seqlen_k)
    q_desc = _group_descriptor(q_base, gqa_group, seqlen_q, stride_qh, stride_qm, _box(q_smem.index(0)))
    do_desc = _group_descriptor(do_base, gqa_group, seqlen_q, stride_doh, stride_dom, _box(do_smem.index(0)))
    t = start_n * 0
    for g in range(0, gqa_group):
        t = _query_blocks(q_desc, do_desc, q_smem, do_smem, bars, g, f_lo, f_hi, f_lo, f_hi, t, False)
        t = _query_blocks(q_desc, do_desc, q_smem, do_smem, bars, g, lo, up - (f_hi - f_lo), f_lo, f_hi, t, True)


@gluon.jit
def _row_values(base, m, n_rows, other, BLOCK_M: gl.constexpr, layout: gl.constexpr):
    # LSE or delta of query rows [m, m + BLOCK_M) (other past n_rows), laid
    # out along the columns of the (keys, queries) tiles: loaded one value per
    # thread and spread through shared memory, which costs far fewer
    # registers than each thread addressing the 16 columns it holds
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    offs = m + gl.arange(0, BLOCK_M, layout=flat)
    x = gl.load(base + offs, mask=offs < n_rows, other=other)
    return gl.convert_layout(x, gl.SliceLayout(0, layout))


@gluon.jit
def _probabilities(s, lse, rows, cols, lo_shift, hi_shift, qk_scale, MASKED: gl.constexpr):
    # P^T (keys x queries) of one block; lse = +inf on rows past the sequence
    p = gl.exp2(s * qk_scale - (lse * LOG2E)[None, :])
    if MASKED:
        p = gl.where(((rows + hi_shift)[None, :] >= cols[:, None]) & ((rows + lo_shift)[None, :] <= cols[:, None]),
                     p, 0.0)
    return p


@gluon.jit
def _dv_range(k_smem, q_smem, do_smem, p_smem, bars, p_bars, dv, t, lse_base, lo_p, up_p, f_lo, f_hi, seqlen_q,
              cols, lo_shift, hi_shift, qk_scale, s_layout: gl.constexpr, op_layout: gl.constexpr,
              MASKED: gl.constexpr):
    q_ready, do_ready, qdo_empty = bars
    p_ready, p_empty = p_bars
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = p_smem.shape[1]
    dtype: gl.constexpr = q_smem.dtype
    offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    if up_p > lo_p:
        m = _block_start(lo_p, f_lo, f_hi, MASKED)
        rows = m + offs_m
        lse = _row_values(lse_base, m, seqlen_q, float("inf"), BLOCK_M, s_layout)
        _ring_wait(q_ready, t, False)
        s = warpgroup_mma(k_smem, q_smem.index(t % 2).permute((1, 0)),
                          gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout), use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s, ))
        p = _probabilities(s, lse, rows, cols, lo_shift, hi_shift, qk_scale, MASKED)
        _ring_wait(p_empty, t, True)
        p_smem.index(t % 2).store(p)
        BARRIER()
        mbarrier.arrive(p_ready.index(t % 2), count=1)
        p_op = gl.convert_layout(p.to(dtype), op_layout)
        t += 1
        for x in range(lo_p + BLOCK_M, up_p, BLOCK_M):
            m = _block_start(x, f_lo, f_hi, MASKED)
            rows = m + offs_m
            lse = _row_values(lse_base, m, seqlen_q, float("inf"), BLOCK_M, s_layout)
            _ring_wait(q_ready, t, False)
            _ring_wait(do_ready, t - 1, False)
            s = warpgroup_mma(k_smem, q_smem.index(t % 2).permute((1, 0)),
                              gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout), use_acc=False,
                              is_async=True)
            dv = warpgroup_mma(p_op, do_smem.index((t - 1) % 2), dv, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s, ))
            p = _probabilities(s, lse, rows, cols, lo_shift, hi_shift, qk_scale, MASKED)
            _ring_wait(p_empty, t, True)
            p_smem.index(t % 2).store(p)
            BARRIER()
            mbarrier.arrive(p_ready.index(t % 2), count=1)
            dv = warpgroup_mma_wait(0, deps=(dv, ))
            mbarrier.arrive(qdo_empty.index((t - 1) % 2), count=1)
            p_op = gl.convert_layout(p.to(dtype), op_layout)
            t += 1
        _ring_wait(do_ready, t - 1, False)
        dv = warpgroup_mma(p_op, do_smem.index((t - 1) % 2), dv, is_async=True)
        dv = warpgroup_mma_wait(0, deps=(dv, ))
        mbarrier.arrive(qdo_empty.index((t - 1) % 2), count=1)
    return dv, t


@gluon.jit
def _dv_head(k_smem, q_smem, do_smem, p_smem, bars, p_bars, dv, t, lse_base, lo, up, f_lo, f_hi, seqlen_q, cols,
             lo_shift, hi_shift, qk_scale, s_layout: gl.constexpr, op_layout: gl.constexpr):
    # one query head's blocks: the unmasked ones, then the masked ones
    dv, t = _dv_range(k_smem, q_smem, do_smem, p_smem, bars, p_bars, dv, t, lse_base, f_lo, f_hi, f_lo, f_hi,
                      seqlen_q, cols, lo_shift, hi_shift, qk_scale, s_layout, op_layout, False)
    return _dv_range(k_smem, q_smem, do_smem, p_smem, bars, p_bars, dv, t, lse_base, lo, up - (f_hi - f_lo), f_lo,
                     f_hi, seqlen_q, cols, lo_shift, hi_shift, qk_scale, s_layout, op_layout, True)


@gluon.jit
def _dk_range(v_smem, q_smem, do_smem, p_smem, bars, p_bars, dk, t, delta_base, lo_p, up_p, f_lo, f_hi,
              seqlen_q, s_layout: gl.constexpr, op_layout: gl.constexpr, MASKED: gl.constexpr):
    q_ready, do_ready, qdo_empty = bars
    p_ready, p_empty = p_bars
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = p_smem.shape[1]
    dtype: gl.constexpr = q_smem.dtype
    if up_p > lo_p:
        m = _block_start(lo_p, f_lo, f_hi, MASKED)
        delta = _row_values(delta_base, m, seqlen_q, 0.0, BLOCK_M, s_layout)
        _ring_wait(do_ready, t, False)
        dp = warpgroup_mma(v_smem, do_smem.index(t % 2).permute((1, 0)),
                           gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout), use_acc=False, is_async=True)
        dp = warpgroup_mma_wait(0, deps=(dp, ))
        _ring_wait(p_ready, t, False)
        p = p_smem.index(t % 2).load(s_layout)
        BARRIER()
        mbarrier.arrive(p_empty.index(t % 2), count=1)
        ds_op = gl.convert_layout((p * (dp - delta[None, :])).to(dtype), op_layout)
        t += 1
        for x in range(lo_p + BLOCK_M, up_p, BLOCK_M):
            m = _block_start(x, f_lo, f_hi, MASKED)
            delta = _row_values(delta_base, m, seqlen_q, 0.0, BLOCK_M, s_layout)
            _ring_wait(do_ready, t, False)
            _ring_wait(q_ready, t - 1, False)
            dp = warpgroup_mma(v_smem, do_smem.index(t % 2).permute((1, 0)),
                               gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout), use_acc=False,
                               is_async=True)
            dk = warpgroup_mma(ds_op, q_smem.index((t - 1) % 2), dk, is_async=True)
            dp = warpgroup_mma_wait(1, deps=(dp, ))
            _ring_wait(p_ready, t, False)
            p = p_smem.index(t % 2).load(s_layout)
            BARRIER()
            mbarrier.arrive(p_empty.index(t % 2), count=1)
            ds = (p * (dp - delta[None, :])).to(dtype)
            dk = warpgroup_mma_wait(0, deps=(dk, ))
            mbarrier.arrive(qdo_empty.index((t - 1) % 2), count=1)
            ds_op = gl.convert_layout(ds, op_layout)
            t += 1
        _ring_wait(q_ready, t - 1, False)
        dk = warpgroup_mma(ds_op, q_smem.index((t - 1) % 2), dk, is_async=True)
        dk = warpgroup_mma_wait(0, deps=(dk, ))
        mbarrier.arrive(qdo_empty.index((t - 1) % 2), count=1)
    return dk, t


@gluon.jit
def _store_rows(ptr, stride_row, acc, n_rows, layout: gl.constexpr):
    offs_r = gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, layout))
    offs_d = gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, layout))
    gl.store(ptr + (offs_r[:, None] * stride_row + offs_d[None, :]), acc.to(ptr.dtype.element_ty),
             mask=(offs_r < n_rows)[:, None] & (offs_d < acc.shape[1])[None, :])


@gluon.jit
def _dv_consumer(k_smem, q_smem, do_smem, p_smem, kv_bar, bars, p_bars, dv_blk, stride_dvn, LSE, lse_zq,
                 stride_lh, h0, start_n, seqlen_q, seqlen_k, gqa_group, lo, up, f_lo, f_hi, lo_shift, hi_shift,
                 qk_scale):
    BLOCK_N: gl.constexpr = k_smem.shape[0]
    BLOCK_D: gl.constexpr = k_smem.shape[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                       instr_shape=[16, q_smem.shape[1], 16])
    a_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                       instr_shape=[16, BLOCK_D, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=a_layout, k_width=2)
    cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    dv = gl.zeros([BLOCK_N, BLOCK_D], gl.float32, a_layout)
    t = start_n * 0
    mbarrier.wait(kv_bar, 0)
    for g in range(0, gqa_group):
        dv, t = _dv_head(k_smem, q_smem, do_smem, p_smem, bars, p_bars, dv, t, LSE + lse_zq + (h0 + g) * stride_lh,
                         lo, up, f_lo, f_hi, seqlen_q, cols, lo_shift, hi_shift, qk_scale, s_layout, op_layout)
    _store_rows(dv_blk, stride_dvn, dv, seqlen_k - start_n, a_layout)


@gluon.jit
def _dk_consumer(v_smem, q_smem, do_smem, p_smem, kv_bar, bars, p_bars, dk_blk, stride_dkn, Delta, lse_zq,
                 stride_lh, h0, start_n, seqlen_q, seqlen_k, gqa_group, lo, up, f_lo, f_hi, sm_scale):
    BLOCK_N: gl.constexpr = v_smem.shape[0]
    BLOCK_D: gl.constexpr = v_smem.shape[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                       instr_shape=[16, q_smem.shape[1], 16])
    a_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                       instr_shape=[16, BLOCK_D, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=a_layout, k_width=2)
    dk = gl.zeros([BLOCK_N, BLOCK_D], gl.float32, a_layout)
    t = start_n * 0
    mbarrier.wait(kv_bar, 0)
    for g in range(0, gqa_group):
        delta_base = Delta + lse_zq + (h0 + g) * stride_lh
        dk, t = _dk_range(v_smem, q_smem, do_smem, p_smem, bars, p_bars, dk, t, delta_base, f_lo, f_hi, f_lo, f_hi,
                          seqlen_q, s_layout, op_layout, False)
        dk, t = _dk_range(v_smem, q_smem, do_smem, p_smem, bars, p_bars, dk, t, delta_base, lo, up - (f_hi - f_lo),
                          f_lo, f_hi, seqlen_q, s_layout, op_layout, True)
    _store_rows(dk_blk, stride_dkn, dk * sm_scale, seqlen_k - start_n, a_layout)


@gluon.jit
def attn_bwd_dkdv(
    Q, K, V, BIAS, DO, LSE, Delta, DK, DV, CU_Q, CU_K, RNG_SEED, RNG_OFFSET,
    stride_qz, stride_qh, stride_qm,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_bz, stride_bh, stride_bm,
    stride_doz, stride_doh, stride_dom,
    stride_dkz, stride_dkh, stride_dkn,
    stride_dvz, stride_dvh, stride_dvn,
    stride_lz, stride_lh,
    batch, num_heads, gqa_group, max_seqlen_q, max_seqlen_k, varlen, head_dim,
    bottom_right, window_left, window_right, sm_scale, dropout_p,
    ALIBI, stride_az, stride_ah, has_alibi, softcap,
    BLOCK_D: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    PAD_HEAD: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    ENABLE_DROPOUT: gl.constexpr,
    SPLIT_DKDV: gl.constexpr,
    UPCAST_DOT: gl.constexpr,
):
    gl.static_assert(not PAD_HEAD and not HAS_BIAS and not ENABLE_DROPOUT and not UPCAST_DOT and not SPLIT_DKDV,
                     "the Gluon dK/dV kernel is the fast path only (no softcap or ALiBi either: see PAD_HEAD)")
    gl.static_assert(gl.num_warps() == 4 and BLOCK_N == 64,
                     "one warpgroup per gradient over 64 keys: BLOCK_N = 64, num_warps = 4")
    dtype: gl.constexpr = Q.dtype.element_ty
    gl.static_assert(dtype.primitive_bitwidth == 16, "fp16 / bf16 only")
    start_n, off_z, off_hk, q_start, k_start, seqlen_q, seqlen_k, lo_shift, hi_shift, lo, up, f_lo, f_hi = \
        _key_block(CU_Q, CU_K, batch, num_heads, gqa_group, max_seqlen_q, max_seqlen_k, varlen, bottom_right,
                   window_left, window_right, BLOCK_M, BLOCK_N)
    h0 = off_hk * gqa_group  # the group's first query head
    n_off = k_start.to(gl.int64) + start_n
    k_base = row_ptr(K, off_z, off_hk, k_start, stride_kz, stride_kh, stride_kn)
    v_base = row_ptr(V, off_z, off_hk, k_start, stride_vz, stride_vh, stride_vn)
    dk_blk = row_ptr(DK, off_z, off_hk, n_off, stride_dkz, stride_dkh, stride_dkn)
    dv_blk = row_ptr(DV, off_z, off_hk, n_off, stride_dvz, stride_dvh, stride_dvn)
    q_base = row_ptr(Q, off_z, h0, q_start, stride_qz, stride_qh, stride_qm)
    do_base = row_ptr(DO, off_z, h0, q_start, stride_doz, stride_doh, stride_dom)
    lse_zq = off_z.to(gl.int64) * stride_lz + q_start

    sh_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=min(128, BLOCK_D * 2), element_bitwidth=16,
                                                   rank=2)
    p_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=2, per_phase=1, max_phase=8, order=[1, 0])
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_D], sh_layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_D], sh_layout)
    q_smem = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_M, BLOCK_D], sh_layout)
    do_smem = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_M, BLOCK_D], sh_layout)
    p_smem = gl.allocate_shared_memory(gl.float32, [SLOTS, BLOCK_N, BLOCK_M], p_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    qdo_empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    p_empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(SLOTS):
        mbarrier.init(q_ready.index(i), count=1)  # the producer's expect; TMA completes the bytes
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(qdo_empty.index(i), count=2)  # both consumer warpgroups release Q_i and dO_i
        mbarrier.init(p_ready.index(i), count=1)
        mbarrier.init(p_empty.index(i), count=1)
    bars = (q_ready, do_ready, qdo_empty)
    p_bars = (p_ready, p_empty)

    gl.warp_specialize([
        (_dv_consumer, (k_smem, q_smem, do_smem, p_smem, kv_bar, bars, p_bars, dv_blk, stride_dvn, LSE, lse_zq,
                        stride_lh, h0, start_n, seqlen_q, seqlen_k, gqa_group, lo, up, f_lo, f_hi, lo_shift,
                        hi_shift, sm_scale * LOG2E)),
        (_dk_consumer, (v_smem, q_smem, do_smem, p_smem, kv_bar, bars, p_bars, dk_blk, stride_dkn, Delta, lse_zq,
                        stride_lh, h0, start_n, seqlen_q, seqlen_k, gqa_group, lo, up, f_lo, f_hi,
                        sm_scale)),
        (_producer, (k_smem, v_smem, q_smem, do_smem, kv_bar, bars, k_base, v_base, stride_kn, stride_vn, q_base,
                     do_base, stride_qh, stride_qm, stride_doh, stride_dom, start_n, seqlen_q, seqlen_k,
                     gqa_group, lo, up, f_lo, f_hi)),
    ], [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
