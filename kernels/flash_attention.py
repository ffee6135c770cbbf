"""FlashAttention-2 forward and backward kernels in Triton.

These sources are compiled ahead of time (``triton.compile``) for AMD CDNA
(HIP, wave64) and NVIDIA sm_90, and are also executed on the CPU through
Triton's interpreter. ``kernels/variants.toml`` is the contract for the
argument lists, constexprs, grids and tuning configs.

Layout: Q/K/V/O/DO/DQ/DK/DV are (batch, heads, seqlen, head_dim) tensors
addressed by (z, h, row) strides; the last-dimension stride is 1. LSE and Delta
are contiguous fp32 (batch, heads, seqlen_q) tensors.

Conventions shared by all kernels:

* program id 1 is ``z * num_heads + h``; program id 0 is the row block;
* offsets that grow with the tensor (batch, head, row-block start) are
  computed in int64 on scalars (program ids and strides are cast before they
  are multiplied); the element offsets inside one block (< BLOCK * row stride)
  stay int32, which keeps register use low on the GPU;
* softmax is evaluated in the log2 domain: scores are multiplied by
  ``sm_scale * log2(e)`` and exponentiated with ``exp2``; LSE is stored as a
  natural-log value;
* all element-wise math happens in fp32; matmuls use ``tl.dot`` with fp32
  accumulation and fp16/bf16 operands (P and dS are rounded to the input
  dtype before their dot, as in FlashAttention-2);
* ``UPCAST_DOT=True`` (CPU interpreter only) converts every dot operand to
  fp32 after that rounding, because the interpreter stores bf16 as raw
  uint16 and cannot multiply it (the interpreter's fp32 dot is exact fp32;
  compiled code always uses ``UPCAST_DOT=False``);
* ``IS_CAUSAL`` is the top-left aligned mask ``col <= row`` (only used with
  seqlen_q == seqlen_k).

Each K/Q loop is split (with ``tl.static_range`` over "phases", so the loop body
is written once and specialised at compile time) into blocks that need no
masking at all and the few blocks on the causal diagonal or at the ragged end of
the sequence, which are masked.

The kernels deliberately call no other ``@triton.jit`` function (neither local
helpers nor ``triton.language.standard`` ones such as ``tl.zeros``, ``tl.cdiv``,
``tl.max`` or ``tl.sum``): the CPU path wraps only the kernel itself in
``triton.runtime.interpreter.InterpretedFunction`` (without TRITON_INTERPRET=1
at import time), and a nested JIT function cannot be called there. Row
reductions therefore use ``tl.reduce`` with the standard library's combine
functions, which the interpreter recognises and evaluates with numpy, and which
is exactly what ``tl.max``/``tl.sum`` lower to for fp32 inputs.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2) = 1 / log2(e)


@triton.jit
def attn_fwd(
    Q, K, V, O, LSE,
    stride_qz, stride_qh, stride_qm,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_oz, stride_oh, stride_om,
    num_heads, seqlen_q, seqlen_k, sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    off_zh = tl.program_id(1)
    off_z = (off_zh // num_heads).to(tl.int64)
    off_h = (off_zh % num_heads).to(tl.int64)

    # Scalar int64 base pointers (this head, this query block); the offsets
    # inside one block are small and stay int32.
    m_off64 = tl.cast(start_m, tl.int64)
    q_blk = Q + off_z * stride_qz.to(tl.int64) + off_h * stride_qh.to(tl.int64) \
        + m_off64 * stride_qm.to(tl.int64)
    o_blk = O + off_z * stride_oz.to(tl.int64) + off_h * stride_oh.to(tl.int64) \
        + m_off64 * stride_om.to(tl.int64)
    k_base = K + off_z * stride_kz.to(tl.int64) + off_h * stride_kh.to(tl.int64)
    v_base = V + off_z * stride_vz.to(tl.int64) + off_h * stride_vh.to(tl.int64)
    stride_kn64 = stride_kn.to(tl.int64)
    stride_vn64 = stride_vn.to(tl.int64)

    offs_m0 = tl.arange(0, BLOCK_M)
    offs_m = start_m + offs_m0
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    m_valid = offs_m < seqlen_q

    q = tl.load(q_blk + (offs_m0[:, None] * stride_qm + offs_d[None, :]), mask=m_valid[:, None], other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)
    k_offs = offs_n[:, None] * stride_kn + offs_d[None, :]
    v_offs = offs_n[:, None] * stride_vn + offs_d[None, :]

    qk_scale = sm_scale * LOG2E
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, HEAD_DIM], 0.0, tl.float32)

    # K blocks [0, full_end) need no mask; [full_end, hi) are masked.
    n_full = (seqlen_k // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        hi = tl.minimum(start_m + BLOCK_M, seqlen_k)
        full_end = tl.minimum((start_m // BLOCK_N) * BLOCK_N, n_full)
    else:
        hi = seqlen_k
        full_end = n_full

    for phase in tl.static_range(2):
        if phase == 0:
            lo = 0
            up = full_end
        else:
            lo = full_end
            up = hi
        for start_n in range(lo, up, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            cols = start_n + offs_n
            n_off64 = tl.cast(start_n, tl.int64)
            k_blk = k_base + n_off64 * stride_kn64
            if phase == 0:
                k = tl.load(k_blk + k_offs)
            else:
                k = tl.load(k_blk + k_offs, mask=(cols < seqlen_k)[:, None], other=0.0)
            if UPCAST_DOT:
                k = k.to(tl.float32)
            qk = tl.dot(q, tl.trans(k)) * qk_scale
            if phase == 1:
                keep = (cols < seqlen_k)[None, :]
                if IS_CAUSAL:
                    keep = keep & (cols[None, :] <= offs_m[:, None])
                qk = tl.where(keep, qk, float("-inf"))
            # Every row sees column 0 in its first block, so m_new is finite.
            m_new = tl.maximum(m_i, tl.reduce(qk, 1, tl.standard._elementwise_max))
            p = tl.math.exp2(qk - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
            acc = acc * alpha[:, None]
            v_blk = v_base + n_off64 * stride_vn64
            if phase == 0:
                v = tl.load(v_blk + v_offs)
            else:
                v = tl.load(v_blk + v_offs, mask=(cols < seqlen_k)[:, None], other=0.0)
            p_lp = p.to(V.dtype.element_ty)
            if UPCAST_DOT:
                p_lp = p_lp.to(tl.float32)
                v = v.to(tl.float32)
            acc = tl.dot(p_lp, v, acc)
            m_i = m_new

    acc = acc * (1.0 / l_i)[:, None]
    tl.store(o_blk + (offs_m0[:, None] * stride_om + offs_d[None, :]), acc.to(O.dtype.element_ty),
             mask=m_valid[:, None])
    lse = (m_i + tl.math.log2(l_i)) * LN2
    lse_ptrs = LSE + off_zh.to(tl.int64) * seqlen_q + offs_m
    tl.store(lse_ptrs, lse, mask=m_valid)


@triton.jit
def attn_bwd_preprocess(
    O, DO, Delta,
    stride_oz, stride_oh, stride_om,
    stride_doz, stride_doh, stride_dom,
    num_heads, seqlen_q,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    off_zh = tl.program_id(1)
    off_z = (off_zh // num_heads).to(tl.int64)
    off_h = (off_zh % num_heads).to(tl.int64)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_m = start_m + offs_m0
    offs_d = tl.arange(0, HEAD_DIM)
    m_valid = offs_m < seqlen_q
    m_off64 = tl.cast(start_m, tl.int64)

    o_blk = O + off_z * stride_oz.to(tl.int64) + off_h * stride_oh.to(tl.int64) \
        + m_off64 * stride_om.to(tl.int64)
    do_blk = DO + off_z * stride_doz.to(tl.int64) + off_h * stride_doh.to(tl.int64) \
        + m_off64 * stride_dom.to(tl.int64)
    o = tl.load(o_blk + (offs_m0[:, None] * stride_om + offs_d[None, :]),
                mask=m_valid[:, None], other=0.0).to(tl.float32)
    do = tl.load(do_blk + (offs_m0[:, None] * stride_dom + offs_d[None, :]),
                 mask=m_valid[:, None], other=0.0).to(tl.float32)
    delta = tl.reduce(o * do, 1, tl.standard._sum_combine)
    tl.store(Delta + off_zh.to(tl.int64) * seqlen_q + offs_m, delta, mask=m_valid)


@triton.jit
def attn_bwd_dkdv(
    Q, K, V, DO, LSE, Delta, DK, DV,
    stride_qz, stride_qh, stride_qm,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_doz, stride_doh, stride_dom,
    stride_dkz, stride_dkh, stride_dkn,
    stride_dvz, stride_dvh, stride_dvn,
    num_heads, seqlen_q, seqlen_k, sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    start_n = tl.program_id(0) * BLOCK_N
    off_zh = tl.program_id(1)
    off_z = (off_zh // num_heads).to(tl.int64)
    off_h = (off_zh % num_heads).to(tl.int64)

    # Scalar int64 base pointers; offsets inside one block stay int32.
    n_off64 = tl.cast(start_n, tl.int64)
    k_blk = K + off_z * stride_kz.to(tl.int64) + off_h * stride_kh.to(tl.int64) \
        + n_off64 * stride_kn.to(tl.int64)
    v_blk = V + off_z * stride_vz.to(tl.int64) + off_h * stride_vh.to(tl.int64) \
        + n_off64 * stride_vn.to(tl.int64)
    dk_blk = DK + off_z * stride_dkz.to(tl.int64) + off_h * stride_dkh.to(tl.int64) \
        + n_off64 * stride_dkn.to(tl.int64)
    dv_blk = DV + off_z * stride_dvz.to(tl.int64) + off_h * stride_dvh.to(tl.int64) \
        + n_off64 * stride_dvn.to(tl.int64)
    q_base = Q + off_z * stride_qz.to(tl.int64) + off_h * stride_qh.to(tl.int64)
    do_base = DO + off_z * stride_doz.to(tl.int64) + off_h * stride_doh.to(tl.int64)
    lse_base = LSE + off_zh.to(tl.int64) * seqlen_q
    delta_base = Delta + off_zh.to(tl.int64) * seqlen_q
    stride_qm64 = stride_qm.to(tl.int64)
    stride_dom64 = stride_dom.to(tl.int64)

    offs_n0 = tl.arange(0, BLOCK_N)
    offs_n = start_n + offs_n0
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    n_valid = offs_n < seqlen_k

    k = tl.load(k_blk + (offs_n0[:, None] * stride_kn + offs_d[None, :]), mask=n_valid[:, None], other=0.0)
    v = tl.load(v_blk + (offs_n0[:, None] * stride_vn + offs_d[None, :]), mask=n_valid[:, None], other=0.0)
    if UPCAST_DOT:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    q_offs = offs_m0[:, None] * stride_qm + offs_d[None, :]
    do_offs = offs_m0[:, None] * stride_dom + offs_d[None, :]

    qk_scale = sm_scale * LOG2E
    dk = tl.full([BLOCK_N, HEAD_DIM], 0.0, tl.float32)
    dv = tl.full([BLOCK_N, HEAD_DIM], 0.0, tl.float32)

    # Q blocks: [lo, mid) straddle the causal diagonal (masked), [mid, m_full)
    # are complete and fully visible (unmasked), [max(mid, m_full), seqlen_q)
    # is the ragged tail (masked). Key columns >= seqlen_k only feed rows of
    # dK/dV that are never stored, so they need no mask.
    m_full = (seqlen_q // BLOCK_M) * BLOCK_M
    if IS_CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
        mid = ((start_n + BLOCK_N + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    else:
        lo = 0
        mid = 0

    for phase in tl.static_range(3):
        if phase == 0:
            lo_p = lo
            hi_p = tl.minimum(mid, seqlen_q)
        elif phase == 1:
            lo_p = mid
            hi_p = m_full
        else:
            lo_p = tl.maximum(mid, m_full)
            hi_p = seqlen_q
        for start_m in range(lo_p, hi_p, BLOCK_M):
            start_m = tl.multiple_of(start_m, BLOCK_M)
            rows = start_m + offs_m0
            m_off64 = tl.cast(start_m, tl.int64)
            q_blk = q_base + m_off64 * stride_qm64
            do_blk = do_base + m_off64 * stride_dom64
            if phase == 1:
                q = tl.load(q_blk + q_offs)
                do = tl.load(do_blk + do_offs)
                lse = tl.load(lse_base + rows)
                delta = tl.load(delta_base + rows)
            else:
                r_valid = rows < seqlen_q
                q = tl.load(q_blk + q_offs, mask=r_valid[:, None], other=0.0)
                do = tl.load(do_blk + do_offs, mask=r_valid[:, None], other=0.0)
                # lse = +inf makes P exactly 0 on padded query rows.
                lse = tl.load(lse_base + rows, mask=r_valid, other=float("inf"))
                delta = tl.load(delta_base + rows, mask=r_valid, other=0.0)
            if UPCAST_DOT:
                q = q.to(tl.float32)
                do = do.to(tl.float32)
            # Transposed scores: (BLOCK_N, BLOCK_M).
            qkT = tl.dot(k, tl.trans(q))
            pT = tl.math.exp2(qkT * qk_scale - (lse * LOG2E)[None, :])
            if phase != 1:
                if IS_CAUSAL:
                    pT = tl.where(rows[None, :] >= offs_n[:, None], pT, 0.0)
            pT_lp = pT.to(DO.dtype.element_ty)
            if UPCAST_DOT:
                pT_lp = pT_lp.to(tl.float32)
            dv = tl.dot(pT_lp, do, dv)
            dpT = tl.dot(v, tl.trans(do))
            dsT = pT * (dpT - delta[None, :])
            dsT_lp = dsT.to(Q.dtype.element_ty)
            if UPCAST_DOT:
                dsT_lp = dsT_lp.to(tl.float32)
            dk = tl.dot(dsT_lp, q, dk)

    dk = dk * sm_scale
    tl.store(dk_blk + (offs_n0[:, None] * stride_dkn + offs_d[None, :]), dk.to(DK.dtype.element_ty),
             mask=n_valid[:, None])
    tl.store(dv_blk + (offs_n0[:, None] * stride_dvn + offs_d[None, :]), dv.to(DV.dtype.element_ty),
             mask=n_valid[:, None])


@triton.jit
def attn_bwd_dq(
    Q, K, V, DO, LSE, Delta, DQ,
    stride_qz, stride_qh, stride_qm,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_doz, stride_doh, stride_dom,
    stride_dqz, stride_dqh, stride_dqm,
    num_heads, seqlen_q, seqlen_k, sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    off_zh = tl.program_id(1)
    off_z = (off_zh // num_heads).to(tl.int64)
    off_h = (off_zh % num_heads).to(tl.int64)

    # Scalar int64 base pointers; offsets inside one block stay int32.
    m_off64 = tl.cast(start_m, tl.int64)
    q_blk = Q + off_z * stride_qz.to(tl.int64) + off_h * stride_qh.to(tl.int64) \
        + m_off64 * stride_qm.to(tl.int64)
    do_blk = DO + off_z * stride_doz.to(tl.int64) + off_h * stride_doh.to(tl.int64) \
        + m_off64 * stride_dom.to(tl.int64)
    dq_blk = DQ + off_z * stride_dqz.to(tl.int64) + off_h * stride_dqh.to(tl.int64) \
        + m_off64 * stride_dqm.to(tl.int64)
    k_base = K + off_z * stride_kz.to(tl.int64) + off_h * stride_kh.to(tl.int64)
    v_base = V + off_z * stride_vz.to(tl.int64) + off_h * stride_vh.to(tl.int64)
    stride_kn64 = stride_kn.to(tl.int64)
    stride_vn64 = stride_vn.to(tl.int64)

    offs_m0 = tl.arange(0, BLOCK_M)
    offs_m = start_m + offs_m0
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    m_valid = offs_m < seqlen_q

    q = tl.load(q_blk + (offs_m0[:, None] * stride_qm + offs_d[None, :]), mask=m_valid[:, None], other=0.0)
    do = tl.load(do_blk + (offs_m0[:, None] * stride_dom + offs_d[None, :]), mask=m_valid[:, None], other=0.0)
    lse = tl.load(LSE + off_zh.to(tl.int64) * seqlen_q + offs_m, mask=m_valid, other=0.0)
    delta = tl.load(Delta + off_zh.to(tl.int64) * seqlen_q + offs_m, mask=m_valid, other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse2 = lse * LOG2E
    k_offs = offs_n0[:, None] * stride_kn + offs_d[None, :]
    v_offs = offs_n0[:, None] * stride_vn + offs_d[None, :]

    qk_scale = sm_scale * LOG2E
    dq = tl.full([BLOCK_M, HEAD_DIM], 0.0, tl.float32)

    # K blocks [0, full_end) need no mask; [full_end, hi) are masked. Masking
    # the padded key columns matters here: with K = 0 there, P = exp(-lse)
    # can overflow and inf * 0 would poison dQ.
    n_full = (seqlen_k // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        hi = tl.minimum(start_m + BLOCK_M, seqlen_k)
        full_end = tl.minimum((start_m // BLOCK_N) * BLOCK_N, n_full)
    else:
        hi = seqlen_k
        full_end = n_full

    for phase in tl.static_range(2):
        if phase == 0:
            lo = 0
            up = full_end
        else:
            lo = full_end
            up = hi
        for start_n in range(lo, up, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            cols = start_n + offs_n0
            n_off64 = tl.cast(start_n, tl.int64)
            k_blk = k_base + n_off64 * stride_kn64
            v_blk = v_base + n_off64 * stride_vn64
            if phase == 0:
                k = tl.load(k_blk + k_offs)
                v = tl.load(v_blk + v_offs)
            else:
                k = tl.load(k_blk + k_offs, mask=(cols < seqlen_k)[:, None], other=0.0)
                v = tl.load(v_blk + v_offs, mask=(cols < seqlen_k)[:, None], other=0.0)
            if UPCAST_DOT:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            qk = tl.dot(q, tl.trans(k))
            p = tl.math.exp2(qk * qk_scale - lse2[:, None])
            if phase == 1:
                keep = (cols < seqlen_k)[None, :]
                if IS_CAUSAL:
                    keep = keep & (cols[None, :] <= offs_m[:, None])
                p = tl.where(keep, p, 0.0)
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            ds_lp = ds.to(K.dtype.element_ty)
            if UPCAST_DOT:
                ds_lp = ds_lp.to(tl.float32)
            dq = tl.dot(ds_lp, k, dq)

    dq = dq * sm_scale
    tl.store(dq_blk + (offs_m0[:, None] * stride_dqm + offs_d[None, :]), dq.to(DQ.dtype.element_ty),
             mask=m_valid[:, None])
