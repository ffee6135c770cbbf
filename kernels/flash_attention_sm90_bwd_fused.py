"""The whole backward (dK, dV and dQ) of one key block for sm_90 in Gluon.

``attn_bwd_fused`` takes the argument list of ``flash_attention.attn_bwd_dkdv``
plus an fp32 dQ accumulator (``DQ_ACC``, zeroed by the caller, strided like
the queries) and computes the same dK and dV for the unmasked fast-path
variants at head dims 64 and 128 (fp16/bf16; causal, sliding windows, varlen,
GQA and ragged ends as runtime arguments). It adds each key block's share of
dQ, dS K, into ``DQ_ACC`` by TMA reduce-add; ``flash_attention.attn_bwd_dq_convert``
then scales and converts it into dQ. So every block pair costs five matrix
products (S, dP, dV, dK, dQ) where the split kernels (``attn_bwd_dkdv`` and
``attn_bwd_dq``) cost seven: they compute S and dP twice. At the H100's power
cap the backward's speed follows its energy per pass (docs/BUILD.md, "The
backward at the power cap").

Per CTA of BLOCK_N = 128 keys, in steps of BLOCK_M = 64 queries:

* a producer warpgroup (``flash_attention_sm90_bwd._producer``) copies K and
  V once, then Q_i and dO_i of each query block into two-slot rings by TMA;
* two MMA warpgroups (``_mma``) own 64 keys each: S^T = K_w Q_i^T and
  dP^T = V_w dO_i^T, then P^T and dS^T, then dV_w += P^T dO_i and
  dK_w += dS^T Q_i. Each stores its dS^T rows in shared memory; once both
  have, each computes half of dQ_i's columns, dS_i K[:, half] over all 128
  keys, and adds it to ``DQ_ACC`` by one TMA reduce-add. dS^T has two slots
  (block ``t`` in slot ``t % 2``): with one, the warpgroups met twice per
  step and ran 15-20% slower at head dim 128.

dQ is summed in fp32 in an order that varies from run to run (the key blocks
of a query block add concurrently): not bitwise deterministic, as
FlashAttention's backward. Callers that need determinism run the split
kernels.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from .flash_attention import LOG2E, row_ptr
from .flash_attention_sm90 import _block_start
from .flash_attention_sm90_bwd import (BARRIER, PRODUCER_REGS, PRODUCER_WARPS, SLOTS, _box, _key_block,
                                       _probabilities, _producer, _ring_wait, _store_rows)

MMA_REGS = gl.constexpr(240)


@gluon.jit
def _step(k_w, v_w, k_half, q_smem, do_smem, ds_smem, ds_row, dq_buf, bars, ds_bars, dq_desc, dk, dv, t, g, m,
          lse_base, delta_base, seqlen_q, cols, lo_shift, hi_shift, qk_scale, dq_col,
          s_layout: gl.constexpr, op_layout: gl.constexpr, dq_layout: gl.constexpr, MASKED: gl.constexpr):
    q_ready, do_ready, qdo_empty = bars
    ds_full, ds_empty = ds_bars
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    dtype: gl.constexpr = q_smem.dtype
    slot = t % q_smem.shape[0]
    rows = m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    offs = m + gl.arange(0, BLOCK_M, layout=flat)
    lse = gl.load(lse_base + offs, mask=offs < seqlen_q, other=float("inf"))
    delta = gl.load(delta_base + offs, mask=offs < seqlen_q, other=0.0)
    _ring_wait(q_ready, t, False)
    s = warpgroup_mma(k_w, q_smem.index(slot).permute((1, 0)),
                      gl.zeros([k_w.shape[0], BLOCK_M], gl.float32, s_layout), use_acc=False, is_async=True)
    _ring_wait(do_ready, t, False)
    dp = warpgroup_mma(v_w, do_smem.index(slot).permute((1, 0)),
                       gl.zeros([k_w.shape[0], BLOCK_M], gl.float32, s_layout), use_acc=False, is_async=True)
    s = warpgroup_mma_wait(1, deps=(s, ))
    p = _probabilities(s, gl.convert_layout(lse, gl.SliceLayout(0, s_layout)), rows, cols, lo_shift, hi_shift,
                       qk_scale, MASKED)
    dp = warpgroup_mma_wait(0, deps=(dp, ))
    # P^T and dP^T in fp32 end here, before the products that accumulate
    # dV and dK take registers for their operands (no spills at head dim 128)
    ds = (p * (dp - gl.convert_layout(delta, gl.SliceLayout(0, s_layout))[None, :])).to(dtype)
    p_op = gl.convert_layout(p.to(dtype), op_layout)
    dv = warpgroup_mma(p_op, do_smem.index(slot), dv, is_async=True)
    dk = warpgroup_mma(gl.convert_layout(ds, op_layout), q_smem.index(slot), dk, is_async=True)
    # dS^T rows of this warpgroup's keys, for both warpgroups' dQ halves; two
    # slots, so neither warpgroup waits for the other to finish the last step
    ds_slot = ds_smem.index(t % 2)
    _ring_wait(ds_empty, t, True)
    ds_slot.slice(ds_row, ds.shape[0]).store(ds)
    fence_async_shared()
    BARRIER()
    mbarrier.arrive(ds_full.index(t % 2), count=1)
    _ring_wait(ds_full, t, False)
    dq = warpgroup_mma(ds_slot.permute((1, 0)), k_half,
                       gl.zeros([BLOCK_M, k_half.shape[1]], gl.float32, dq_layout), use_acc=False, is_async=True)
    dq, dk, dv = warpgroup_mma_wait(0, deps=(dq, dk, dv))
    BARRIER()
    mbarrier.arrive(ds_empty.index(t % 2), count=1)
    mbarrier.arrive(qdo_empty.index(slot), count=1)
    # the reduce-add of the last step has read the staging buffer
    tma.store_wait(0)
    BARRIER()
    dq_buf.store(dq)
    fence_async_shared()
    BARRIER()
    tma.async_atomic_add(dq_desc, [g, m, dq_col], _box(dq_buf))
    return dk, dv, t + 1


@gluon.jit
def _mma(k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar, bars, ds_bars, dk_blk, dv_blk, stride_dkn,
         stride_dvn, LSE, Delta, lse_zq, stride_lh, h0, dqa_base, stride_dqah, stride_dqam, start_n, seqlen_q,
         seqlen_k, gqa_group, lo, up, f_lo, f_hi, lo_shift, hi_shift, sm_scale, W: gl.constexpr):
    KEYS: gl.constexpr = k_smem.shape[0] // 2
    BLOCK_D: gl.constexpr = k_smem.shape[1]
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    HALF_D: gl.constexpr = BLOCK_D // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                       instr_shape=[16, BLOCK_D, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                        instr_shape=[16, HALF_D, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=a_layout, k_width=2)
    k_w = k_smem.slice(W * KEYS, KEYS)
    v_w = v_smem.slice(W * KEYS, KEYS)
    k_half = k_smem.slice(W * HALF_D, HALF_D, dim=1)
    ds_row: gl.constexpr = W * KEYS  # this warpgroup's rows of dS^T
    dq_w = dq_smem.index(W)  # its dQ staging buffer
    dq_box = _box(dq_w)
    dq_desc = tma.make_tensor_descriptor(dqa_base, [gqa_group, gl.maximum(seqlen_q, 1), BLOCK_D],
                                         [stride_dqah, stride_dqam, 1], dq_box.shape, dq_box.type.layout)
    start_w = start_n + W * KEYS
    cols = start_w + gl.arange(0, KEYS, layout=gl.SliceLayout(1, s_layout))
    qk_scale = sm_scale * LOG2E
    dk = gl.zeros([KEYS, BLOCK_D], gl.float32, a_layout)
    dv = gl.zeros([KEYS, BLOCK_D], gl.float32, a_layout)
    t = start_n * 0
    mbarrier.wait(kv_bar, 0)
    for g in range(0, gqa_group):
        lse_base = LSE + lse_zq + (h0 + g) * stride_lh
        delta_base = Delta + lse_zq + (h0 + g) * stride_lh
        for x in range(f_lo, f_hi, BLOCK_M):
            dk, dv, t = _step(k_w, v_w, k_half, q_smem, do_smem, ds_smem, ds_row, dq_w, bars, ds_bars, dq_desc, dk,
                              dv, t, g, x, lse_base, delta_base, seqlen_q, cols, lo_shift, hi_shift, qk_scale,
                              W * HALF_D, s_layout, op_layout, dq_layout, False)
        for x in range(lo, up - (f_hi - f_lo), BLOCK_M):
            dk, dv, t = _step(k_w, v_w, k_half, q_smem, do_smem, ds_smem, ds_row, dq_w, bars, ds_bars, dq_desc, dk,
                              dv, t, g, _block_start(x, f_lo, f_hi, True), lse_base, delta_base, seqlen_q, cols,
                              lo_shift, hi_shift, qk_scale, W * HALF_D, s_layout, op_layout, dq_layout, True)
    tma.store_wait(0)
    n_rows = seqlen_k - start_w
    _store_rows(dv_blk + W * KEYS * stride_dvn, stride_dvn, dv, n_rows, a_layout)
    _store_rows(dk_blk + W * KEYS * stride_dkn, stride_dkn, dk * sm_scale, n_rows, a_layout)


# The two MMA warpgroups' partitions. Worker partitions take no constexpr
# arguments, and a warpgroup's rows of a dS^T ring slot are a slice at a
# constexpr offset after the slot's index (Gluon slices a multibuffer only
# in that order), so W is bound here rather than passed.
@gluon.jit
def _mma0(k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar, bars, ds_bars, dk_blk, dv_blk, stride_dkn,
          stride_dvn, LSE, Delta, lse_zq, stride_lh, h0, dqa_base, stride_dqah, stride_dqam, start_n, seqlen_q,
          seqlen_k, gqa_group, lo, up, f_lo, f_hi, lo_shift, hi_shift, sm_scale):
    _mma(k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar, bars, ds_bars, dk_blk, dv_blk, stride_dkn,
         stride_dvn, LSE, Delta, lse_zq, stride_lh, h0, dqa_base, stride_dqah, stride_dqam, start_n, seqlen_q,
         seqlen_k, gqa_group, lo, up, f_lo, f_hi, lo_shift, hi_shift, sm_scale, 0)


@gluon.jit
def _mma1(k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar, bars, ds_bars, dk_blk, dv_blk, stride_dkn,
          stride_dvn, LSE, Delta, lse_zq, stride_lh, h0, dqa_base, stride_dqah, stride_dqam, start_n, seqlen_q,
          seqlen_k, gqa_group, lo, up, f_lo, f_hi, lo_shift, hi_shift, sm_scale):
    _mma(k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar, bars, ds_bars, dk_blk, dv_blk, stride_dkn,
         stride_dvn, LSE, Delta, lse_zq, stride_lh, h0, dqa_base, stride_dqah, stride_dqam, start_n, seqlen_q,
         seqlen_k, gqa_group, lo, up, f_lo, f_hi, lo_shift, hi_shift, sm_scale, 1)


@gluon.jit
def attn_bwd_fused(
    Q, K, V, BIAS, DO, LSE, Delta, DK, DV, DQ_ACC, CU_Q, CU_K, RNG_SEED, RNG_OFFSET,
    stride_qz, stride_qh, stride_qm,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_bz, stride_bh, stride_bm,
    stride_doz, stride_doh, stride_dom,
    stride_dkz, stride_dkh, stride_dkn,
    stride_dvz, stride_dvh, stride_dvn,
    stride_dqaz, stride_dqah, stride_dqam,
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
    UPCAST_DOT: gl.constexpr,
    MIN_SEQLEN: gl.constexpr,
):
    # MIN_SEQLEN is the runtime's: the shortest seqlen_q and seqlen_k it launches this
    # kernel for (variants.toml); the code does not depend on it.
    gl.static_assert(not PAD_HEAD and not HAS_BIAS and not ENABLE_DROPOUT and not UPCAST_DOT,
                     "the fused backward is the fast path only (no softcap or ALiBi either: see PAD_HEAD)")
    gl.static_assert(gl.num_warps() == 4 and BLOCK_N == 128 and BLOCK_M == 64,
                     "two warpgroups of 64 keys and 64-query steps: BLOCK_N = 128, BLOCK_M = 64, num_warps = 4")
    gl.static_assert(BLOCK_D == 64 or BLOCK_D == 128, "head dim 64 or 128")
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
    dqa_base = row_ptr(DQ_ACC, off_z, h0, q_start, stride_dqaz, stride_dqah, stride_dqam)
    lse_zq = off_z.to(gl.int64) * stride_lz + q_start

    sh_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=min(128, BLOCK_D * 2), element_bitwidth=16,
                                                   rank=2)
    # K is also dQ's B operand in two column halves: its swizzle spans one half
    k_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=BLOCK_D, element_bitwidth=16, rank=2)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    dq_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_D], k_layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_D], sh_layout)
    q_smem = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_M, BLOCK_D], sh_layout)
    do_smem = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_M, BLOCK_D], sh_layout)
    ds_smem = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_N, BLOCK_M], ds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, BLOCK_D // 2], dq_layout)  # one per warpgroup
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    qdo_empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    ds_full = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    ds_empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(SLOTS):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(qdo_empty.index(i), count=2)  # both MMA warpgroups release Q_i and dO_i
        mbarrier.init(ds_full.index(i), count=2)  # both MMA warpgroups store and read dS
        mbarrier.init(ds_empty.index(i), count=2)
    bars = (q_ready, do_ready, qdo_empty)
    ds_bars = (ds_full, ds_empty)

    mma_args = (k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar, bars, ds_bars, dk_blk, dv_blk,
                stride_dkn, stride_dvn, LSE, Delta, lse_zq, stride_lh, h0, dqa_base, stride_dqah, stride_dqam,
                start_n, seqlen_q, seqlen_k, gqa_group, lo, up, f_lo, f_hi, lo_shift, hi_shift, sm_scale)
    gl.warp_specialize([
        (_mma0, mma_args),
        (_mma1, mma_args),
        (_producer, (k_smem, v_smem, q_smem, do_smem, kv_bar, bars, k_base, v_base, stride_kn, stride_vn, q_base,
                     do_base, stride_qh, stride_qm, stride_doh, stride_dom, start_n, seqlen_q, seqlen_k,
                     gqa_group, lo, up, f_lo, f_hi)),
    ], [4, PRODUCER_WARPS], [MMA_REGS, PRODUCER_REGS])
