"""The forward fast path for sm_90 in Gluon: warp-specialised, with the
softmax of each key block overlapped with the previous block's P V product.

``attn_fwd`` here takes the argument list of ``flash_attention.attn_fwd`` and
computes the same thing for its unmasked fast-path variants (``PAD_HEAD``,
``HAS_BIAS``, ``ENABLE_DROPOUT`` and ``UPCAST_DOT`` all off; fp16/bf16;
causal, sliding windows, varlen, GQA and ragged ends as runtime arguments,
see that module's docstring for the conventions). variants.toml compiles it
for sm_90 through a config with ``function = "flash_attention_sm90:attn_fwd"``;
AMD archs and the CPU interpreter run ``flash_attention.attn_fwd``.

Why it exists: Triton compiles the forward loop into one instruction stream
in which every warp loads, multiplies and exponentiates in turn, with a CTA
barrier between the steps (docs/BUILD.md, "Speed limits"). Here, per CTA of
128 query rows:

* one producer warpgroup (``_producer``) copies K and V blocks with TMA
  into two-slot rings (one thread issues each copy; the copy engine
  signals the slot's ``ready`` mbarrier when its bytes land), waiting on a
  slot's ``empty`` mbarrier before refilling it. The tensor descriptors are
  built on the device, per sequence (base, rows, row stride), so TMA
  zero-fills the rows past a sequence's end; they live in the launch's
  global scratch, which the runtime allocates;
* two consumer warpgroups (``_consumer``), 64 query rows each, copy their
  own halves of Q (building those descriptors while the producer builds
  K's), then run the online softmax with no CTA-wide barrier between
  them. In every iteration a warpgroup issues S = Q K_j^T and O +=
  P_{j-1} V_{j-1} as asynchronous wgmma, waits for S only, computes the
  softmax of block j while the P V product runs, then waits for it and
  rescales O (FlashAttention-3's intra-warpgroup overlap).

Block order matches ``flash_attention.attn_fwd``: the unmasked blocks, then
the masked ones at the diagonal / window edges / ragged end. The ring slot
and mbarrier parity of a block follow from its index ``t`` counted over both
phases: slot ``t % 2``, parity ``(t // 2) & 1``.

``num_warps`` of the config is the consumer warpgroup size (4); the kernel
runs 12 warps, which the compiled metadata records and the runtime launches.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from .flash_attention import (LN2, LOG2E, heavy_first_row_block, key_block_ranges, program_batch_head,
                              query_program_sequence, row_ptr)

# TMA copy into shared memory: async_load from triton 3.9, the older name before
TMA_LOAD = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
SLOTS = gl.constexpr(2)  # ring depth of K and of V (2 x 2 x 32 KiB + Q at head dim 128)
PRODUCER_WARPS = gl.constexpr(4)
# Registers per thread after the warpgroups rebalance (setmaxnreg): the
# producer only builds descriptors and issues copies; 2 x 128 x 224 + 128 x 56
# <= 65536.
PRODUCER_REGS = gl.constexpr(56)
CONSUMER_REGS = gl.constexpr(224)


@gluon.jit
def _rows_descriptor(base, rows, stride_row, smem):
    # rows x head dim from base; TMA reads zeros past the last row
    return tma.make_tensor_descriptor(base, [gl.maximum(rows, 1), smem.shape[1]], [stride_row, 1],
                                      [smem.shape[0], smem.shape[1]], smem.type.layout)


@gluon.jit
def _block_start(x, f_lo, f_hi, MASKED: gl.constexpr):
    if MASKED:
        return x + (x >= f_lo).to(gl.int32) * (f_hi - f_lo)
    else:
        return x


@gluon.jit
def _softmax_step(s, m_i, l_i, exp_scale, cols, rows, seqlen_k, lo_shift, hi_shift, MASKED: gl.constexpr):
    if MASKED:
        keep = (cols < seqlen_k)[None, :] & (cols[None, :] <= (rows + hi_shift)[:, None]) \
            & (cols[None, :] >= (rows + lo_shift)[:, None])
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * exp_scale)
    if MASKED:
        # a row that has seen no key yet shifts by 0: p = alpha = 0, not NaN
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new  # the unmasked blocks come first and every row sees them
    p = gl.exp2(s * exp_scale - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _produce_range(k_smem, v_smem, bars, k_desc, v_desc, lo_p, up_p, f_lo, f_hi, t, MASKED: gl.constexpr):
    # Copies (K_i, V_{i-1}) for each block, then V of the last: the order the
    # consumer needs them in. t counts blocks over both phases (ring slot
    # t % NB, parity (t // NB) & 1); the caller has copied K of block t = 0.
    k_ready, k_empty, v_ready, v_empty = bars
    NB: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    nbytes: gl.constexpr = k_smem.shape[1] * k_smem.shape[2] * k_smem.dtype.primitive_bitwidth // 8
    prev_n = lo_p * 0
    for x in range(lo_p, up_p + BLOCK_N, BLOCK_N):
        n = _block_start(x, f_lo, f_hi, MASKED)
        if (x < up_p) & (t > 0):
            slot = t % NB
            mbarrier.wait(k_empty.index(slot), ((t // NB) & 1) ^ 1)
            mbarrier.expect(k_ready.index(slot), nbytes)
            TMA_LOAD(k_desc, [n, 0], k_ready.index(slot), k_smem.index(slot))
        if x > lo_p:
            pslot = (t - 1) % NB
            mbarrier.wait(v_empty.index(pslot), (((t - 1) // NB) & 1) ^ 1)
            mbarrier.expect(v_ready.index(pslot), nbytes)
            TMA_LOAD(v_desc, [prev_n, 0], v_ready.index(pslot), v_smem.index(pslot))
        prev_n = n
        t = t + (x < up_p).to(gl.int32)
    return t


@gluon.jit
def _consume_range(q_smem, k_smem, v_smem, bars, m_i, l_i, acc, t,
                   lo_p, up_p, f_lo, f_hi, seqlen_k, rows, lo_shift, hi_shift, exp_scale,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr, MASKED: gl.constexpr):
    k_ready, k_empty, v_ready, v_empty = bars
    NB: gl.constexpr = k_smem.shape[0]
    dtype: gl.constexpr = k_smem.dtype
    offs_c = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    if up_p > lo_p:
        n = _block_start(lo_p, f_lo, f_hi, MASKED)
        slot = t % NB
        mbarrier.wait(k_ready.index(slot), (t // NB) & 1)
        fence_async_shared()
        s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)),
                          gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s, ))
        mbarrier.arrive(k_empty.index(slot), count=1)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, exp_scale, n + offs_c, rows, seqlen_k, lo_shift,
                                           hi_shift, MASKED)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        t += 1
        for x in range(lo_p + BLOCK_N, up_p, BLOCK_N):
            n = _block_start(x, f_lo, f_hi, MASKED)
            slot = t % NB
            pslot = (t - 1) % NB
            mbarrier.wait(k_ready.index(slot), (t // NB) & 1)
            mbarrier.wait(v_ready.index(pslot), ((t - 1) // NB) & 1)
            fence_async_shared()
            s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)),
                              gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
            acc = warpgroup_mma(p_op, v_smem.index(pslot), acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s, ))
            mbarrier.arrive(k_empty.index(slot), count=1)
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, exp_scale, n + offs_c, rows, seqlen_k, lo_shift,
                                               hi_shift, MASKED)
            acc = warpgroup_mma_wait(0, deps=(acc, ))
            mbarrier.arrive(v_empty.index(pslot), count=1)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            t += 1
        pslot = (t - 1) % NB
        mbarrier.wait(v_ready.index(pslot), ((t - 1) // NB) & 1)
        fence_async_shared()
        acc = warpgroup_mma(p_op, v_smem.index(pslot), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(v_empty.index(pslot), count=1)
    return m_i, l_i, acc, t


@gluon.jit
def _consumer(q_half, r0, q_bar, q_seq, stride_qm, k_smem, v_smem, bars, o_blk, stride_om, lse_base, start_m,
              seqlen_q, f_lo, f_hi, lo, hi, seqlen_k, lo_shift, hi_shift, exp_scale):
    # One warpgroup: rows [r0, r0 + HM) of the query block. It copies its
    # half of Q itself, building that tensor map while the producer builds
    # K's (each takes most of a microsecond before the first S product can
    # start). Rows past the sequence's end copy nothing (the sequence may be
    # empty, its base the tensor's end): q_bar then completes by a plain
    # arrival.
    NW: gl.constexpr = gl.num_warps()
    HM: gl.constexpr = q_half.shape[0]
    BLOCK_D: gl.constexpr = q_half.shape[1]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    dtype: gl.constexpr = q_half.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                       instr_shape=[16, BLOCK_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    rows = start_m + r0 + gl.arange(0, HM, layout=row_s)
    m_i = gl.full([HM], float("-inf"), gl.float32, row_s)
    l_i = gl.full([HM], 0.0, gl.float32, row_s)
    acc = gl.zeros([HM, BLOCK_D], gl.float32, o_layout)
    live = start_m + r0 < seqlen_q
    q_desc = _rows_descriptor(q_seq, seqlen_q, stride_qm, q_half)
    mbarrier.expect(q_bar, HM * BLOCK_D * dtype.primitive_bitwidth // 8, pred=live)
    TMA_LOAD(q_desc, [start_m + r0, 0], q_bar, q_half, pred=live)
    mbarrier.arrive(q_bar, count=1, pred=start_m + r0 >= seqlen_q)
    mbarrier.wait(q_bar, 0)
    m_i, l_i, acc, t = _consume_range(q_half, k_smem, v_smem, bars, m_i, l_i, acc, f_lo * 0, f_lo, f_hi, f_lo,
                                      f_hi, seqlen_k, rows, lo_shift, hi_shift, exp_scale, HM, BLOCK_N,
                                      s_layout, o_layout, p_layout, False)
    m_i, l_i, acc, t = _consume_range(q_half, k_smem, v_smem, bars, m_i, l_i, acc, t, lo, hi - (f_hi - f_lo),
                                      f_lo, f_hi, seqlen_k, rows, lo_shift, hi_shift, exp_scale, HM, BLOCK_N,
                                      s_layout, o_layout, p_layout, True)
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    lse = gl.where(empty, float("inf"), (m_i + gl.log2(l_safe)) * LN2)
    acc = acc * gl.convert_layout(1.0 / l_safe, row_o)[:, None]
    # The wgmma layout gives a thread 4-byte pieces of 8 rows; stored from it,
    # the epilogue took 2 us per CTA at head dim 128. Through a layout with 16
    # contiguous bytes per thread (the conversion goes through shared memory)
    # it is a fraction of that.
    TD: gl.constexpr = BLOCK_D // 8
    st_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TD, TD], [NW, 1], [1, 0])
    offs_om = r0 + gl.arange(0, HM, layout=gl.SliceLayout(1, st_layout))
    offs_od = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, st_layout))
    gl.store(o_blk + (offs_om[:, None] * stride_om + offs_od[None, :]), gl.convert_layout(acc.to(dtype), st_layout),
             mask=(offs_om < seqlen_q - start_m)[:, None] & (offs_od < BLOCK_D)[None, :])
    gl.store(lse_base + rows, lse, mask=rows < seqlen_q)


@gluon.jit
def _producer(k_smem, v_smem, bars, k_base, v_base, stride_kn, stride_vn, f_lo, f_hi, lo, hi, seqlen_k):
    # K and V are copied only by programs that see a key (seqlen_k > 0)
    k_desc = _rows_descriptor(k_base, seqlen_k, stride_kn, k_smem.index(0))
    # The first block's K goes out before V's descriptor is built (about a
    # microsecond): the first S product waits on it, the first P V product
    # comes a softmax later.
    k_ready = bars[0]
    has_unmasked = f_hi > f_lo
    has_block = has_unmasked | (hi - (f_hi - f_lo) > lo)
    first = gl.where(has_unmasked, f_lo, _block_start(lo, f_lo, f_hi, True))
    k_bytes: gl.constexpr = k_smem.shape[1] * k_smem.shape[2] * k_smem.dtype.primitive_bitwidth // 8
    mbarrier.expect(k_ready.index(0), k_bytes, pred=has_block)
    TMA_LOAD(k_desc, [first, 0], k_ready.index(0), k_smem.index(0), pred=has_block)
    v_desc = _rows_descriptor(v_base, seqlen_k, stride_vn, v_smem.index(0))
    t = _produce_range(k_smem, v_smem, bars, k_desc, v_desc, f_lo, f_hi, f_lo, f_hi, f_lo * 0, False)
    _produce_range(k_smem, v_smem, bars, k_desc, v_desc, lo, hi - (f_hi - f_lo), f_lo, f_hi, t, True)


@gluon.jit
def attn_fwd(
    Q, K, V, BIAS, O, LSE, DMASK, CU_Q, CU_K, RNG_SEED, RNG_OFFSET,
    stride_qz, stride_qh, stride_qm,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_bz, stride_bh, stride_bm,
    stride_oz, stride_oh, stride_om,
    stride_lz, stride_lh,
    batch, num_heads, gqa_group, max_seqlen_q, max_seqlen_k, varlen, head_dim,
    bottom_right, window_left, window_right, sm_scale, dropout_p, store_dmask,
    ALIBI, stride_az, stride_ah, has_alibi, softcap,
    BLOCK_D: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    PAD_HEAD: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    ENABLE_DROPOUT: gl.constexpr,
    UPCAST_DOT: gl.constexpr,
    PRE_LOAD_V: gl.constexpr = False,  # the Triton kernel's AMD option; its TMA ring loads V early anyway
):
    gl.static_assert(not PAD_HEAD and not HAS_BIAS and not ENABLE_DROPOUT and not UPCAST_DOT,
                     "the Gluon forward is the fast path only")
    gl.static_assert(gl.num_warps() == 4 and BLOCK_M == 128,
                     "two consumer warpgroups of 64 rows: BLOCK_M = 128, num_warps = 4")
    dtype: gl.constexpr = Q.dtype.element_ty
    gl.static_assert(dtype.primitive_bitwidth == 16, "fp16 / bf16 only")
    sh_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=min(128, BLOCK_D * 2), element_bitwidth=16,
                                                   rank=2)

    start_m = heavy_first_row_block(BLOCK_M)
    _, off_z32, off_h32 = program_batch_head(num_heads, 1)
    off_z = off_z32.to(gl.int64)
    off_h = off_h32.to(gl.int64)
    off_hk = (off_h32 // gqa_group).to(gl.int64)

    _, q_start, k_start, seqlen_q, seqlen_k, diagonal = query_program_sequence(
        CU_Q, CU_K, off_z32, start_m, batch, max_seqlen_q, max_seqlen_k, varlen)
    causal_shift = bottom_right * diagonal

    q_seq = row_ptr(Q, off_z, off_h, q_start, stride_qz, stride_qh, stride_qm)
    o_blk = row_ptr(O, off_z, off_h, q_start + start_m, stride_oz, stride_oh, stride_om)
    k_base = row_ptr(K, off_z, off_hk, k_start, stride_kz, stride_kh, stride_kn)
    v_base = row_ptr(V, off_z, off_hk, k_start, stride_vz, stride_vh, stride_vn)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_D], sh_layout)
    k_smem = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_N, BLOCK_D], sh_layout)
    v_smem = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_N, BLOCK_D], sh_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # one per Q half
    for i in gl.static_range(SLOTS):
        mbarrier.init(k_ready.index(i), count=1)  # the producer's expect; TMA completes the bytes
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # one arrival per consumer warpgroup
        mbarrier.init(v_empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(q_bar.index(i), count=1)  # the consumer's own expect
    bars = (k_ready, k_empty, v_ready, v_empty)

    qk_scale = sm_scale * LOG2E
    lo_shift, hi_shift, lo, hi, f_lo, f_hi = key_block_ranges(
        start_m, seqlen_q, seqlen_k, causal_shift, window_left, window_right, BLOCK_M, BLOCK_N)
    lse_base = LSE + off_z * stride_lz + off_h * stride_lh + q_start

    cons_args = (q_seq, stride_qm, k_smem, v_smem, bars, o_blk, stride_om, lse_base, start_m, seqlen_q,
                 f_lo, f_hi, lo, hi, seqlen_k, lo_shift, hi_shift, qk_scale)
    HM: gl.constexpr = BLOCK_M // 2
    # (worker partitions take no constexpr arguments: shapes come from the
    # shared-memory descriptors, the row offset as a runtime scalar)
    gl.warp_specialize([
        (_consumer, (q_smem.slice(0, HM, dim=0), start_m * 0, q_bar.index(0)) + cons_args),
        (_consumer, (q_smem.slice(HM, HM, dim=0), start_m * 0 + HM, q_bar.index(1)) + cons_args),
        (_producer, (k_smem, v_smem, bars, k_base, v_base, stride_kn, stride_vn, f_lo, f_hi, lo, hi, seqlen_k)),
    ], [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
