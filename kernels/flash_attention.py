"""FlashAttention-2 forward and backward kernels in Triton.

These sources are compiled ahead of time (``triton.compile``) for AMD CDNA
(HIP, wave64) and NVIDIA sm_90, and are also executed on the CPU through
Triton's interpreter. ``kernels/variants.toml`` is the contract for the
argument lists, constexprs, grids and tuning configs.

Layout: Q/O/DO/DQ are (batch, num_heads, seqlen_q, head_dim) and K/V/DK/DV are
(batch, num_heads // gqa_group, seqlen_k, head_dim) tensors addressed by
(z, h, row) strides; the last-dimension stride is 1. LSE and Delta are fp32
rows addressed by (z, h) strides (``stride_lz``, ``stride_lh``) with unit row
stride. BIAS / DBIAS are (batch, num_heads, seqlen_q, seqlen_k) views with a
unit key stride (broadcast dims have stride 0). DMASK is a contiguous
(batch, num_heads, max_seqlen_q, max_seqlen_k) tensor.

Conventions shared by all kernels:

* program id 1 + program id 2 * (grid size 1) is ``z * heads + h`` (query
  heads, except in ``attn_bwd_dkdv`` where it is the key/value head;
  :func:`program_batch_head`): the y grid dimension holds at most 65535,
  the rest continues along z, and
  programs past ``batch`` do nothing; program id 0 is the row block (from
  the last in the forward and dQ kernels: :func:`heavy_first_row_block`);
* variable-length batches (``varlen != 0``): Q/K/V are packed (total, heads,
  head_dim) with no z stride; sequence z holds rows ``CU_Q[z] ..
  CU_Q[z + 1]`` of Q (``CU_K`` for K/V) and its own seqlens
  (:func:`packed_rows`); ``max_seqlen_q/k`` size the grid. Dense batches have ``varlen = 0`` and
  ``seqlen = max_seqlen``; a program past its sequence's end does nothing.
  Sequences need not lie end to end: per side (Q: bits 1-2 of ``varlen``,
  K/V: bits 3-4) that side's vector holds ``batch + 1`` entries, then
  ``batch + 1`` more, and a STARTS bit (2, 8) takes sequence z's first row
  from ``CU[batch + 1 + z]``, a LENGTHS bit (4, 16) its row count from
  ``CU[z]`` rather than ``CU[z + 1] - CU[z]`` (LENGTHS comes with STARTS).
  Nothing is read on the host, so a CUDA/HIP graph records such a call like
  any other: PyTorch's seqused_k and Transformer Engine's padded layout;
* GQA/MQA: query head ``h`` reads key/value head ``h // gqa_group``
  (``gqa_group = num_heads // num_heads_k``, 1 without GQA). ``attn_bwd_dkdv``
  runs one program per key/value head and key block and loops over the
  ``gqa_group`` query heads that share it, so dK/dV are summed over the group
  in registers: no atomics, deterministic;
* head dims: ``BLOCK_D`` (constexpr, a power of two >= 16) is the padded
  width of every tile along the head dim and ``head_dim`` (runtime) the real
  one (a multiple of 8). With ``PAD_HEAD`` every load and store is masked
  with ``d < head_dim``: columns past ``head_dim`` are read as 0 (they add
  nothing to Q K^T, dP or the row sums) and never written, so no byte outside
  the caller's tensors is touched. The mask is written
  ``d < (head_dim // 8) * 8`` so that Triton knows it comes in runs of 8
  elements and keeps 16-byte vector loads. Without ``PAD_HEAD`` the d axis is
  unmasked (``head_dim == BLOCK_D``: the fast path). ``attn_bwd_preprocess``
  is memory-bound and always masks d;
* causal and sliding window: key column ``j`` is visible from query row ``i``
  iff ``i + causal_shift - window_left <= j <= i + causal_shift +
  window_right`` (flash-attn's local attention), where a negative
  ``window_left`` / ``window_right`` leaves that side unbounded. The
  diagonal ``causal_shift = seqlen_k - seqlen_q`` (``bottom_right = 1``) is
  the bottom-right alignment (torch's CUDA flash op, flash-attn),
  ``causal_shift = 0`` the top-left one (torch's math backend, CPU flash op
  and efficient op), per sequence. Causal attention is
  ``window_right = 0``; ``window_left = window_right = -1`` makes every key
  visible (non-causal). The kernels turn these into per-row column bounds
  ``[i + lo_shift, i + hi_shift]``. Causality and windows are runtime
  arguments, not compiled variants: the loops visit only the key (query)
  blocks some row of the tile can see, and the mask is only evaluated in the
  few blocks that straddle a window edge or the ragged end, which exist
  anyway (the masked blocks on both sides are walked as one loop, so the
  body is instantiated twice, not three times). A row that sees no key
  (bottom-right with seqlen_q > seqlen_k, or a window that misses every key)
  gets output 0 and LSE = +inf (as FlashAttention-2), which makes its P
  exactly 0 in the backward kernels; the host clamps window sizes to
  ``seqlen_q + seqlen_k`` so that no bound overflows int32;
* offsets that grow with the tensor (batch, head, row-block start) are
  computed in int64 on scalars (program ids and strides are cast before they
  are multiplied: :func:`row_ptr`); the element offsets inside one block
  (< BLOCK * row stride) stay int32, which keeps register use low on the
  GPU;
* softmax is evaluated in the log2 domain: scores are multiplied by
  ``sm_scale * log2(e)`` and exponentiated with ``exp2``; LSE is stored as a
  natural-log value;
* all element-wise math happens in fp32; matmuls use ``tl.dot`` with fp32
  accumulation and fp16/bf16 operands (P and dS are rounded to the input
  dtype before their dot, as in FlashAttention-2); ``input_precision="ieee"``
  keeps fp32 inputs in fp32 (no TF32; it changes nothing for fp16/bf16);
* ``HAS_BIAS``: the bias (natural-log units) is added to the scaled scores;
  a -inf bias hides a key like the causal mask does, and the first, unmasked
  blocks then use the same guarded row maximum as the masked ones. dBias is
  dS itself, stored by ``attn_bwd_dq`` when ``store_dbias``;
* ``ENABLE_DROPOUT``: score (z, h, i, j) is kept iff the top 24 bits of the
  first word of Philox-4x32-10 (key: the seed at ``RNG_SEED``; 128-bit
  counter: ``e = ((z * heads + h) * max_seqlen_q + i) * max_seqlen_k + j``
  in the low words, the offset at ``RNG_OFFSET`` in the high ones), plus
  one, times 2**-24 (a uniform draw u in (0, 1],
  like curand_uniform's range), is > ``dropout_p`` (torch's rule for the
  efficient op's mask: ``u > p``; u is never 0, so p = 0 keeps everything);
  kept probabilities are scaled by 1 / (1 - dropout_p), in fp32 (the
  output and dV once at their stores, dP before dS), never before a
  rounding to fp16/bf16: a row's largest P is exactly 1 and fp16(1 / (1 -
  p)) is not 1 / (1 - p), a bias that Delta = rowsum(O dO) sums into dK
  over every query row (flash-attn scales at the end too). Seed and offset are
  read from device memory, so a CUDA graph replays with whatever the
  captured RNG op wrote there. The backward kernels regenerate the same
  draws, and ``dropout_uniform`` writes them out for torch's mask
  regeneration (``philox.philox_uniform``);
  with ``store_dmask`` the forward writes the unnormalised probability to
  DMASK, negated where dropped;
* softcap and ALiBi (runtime arguments, uniform branches: no compiled
  variants of their own; only the ``PAD_HEAD`` variants, the general ones,
  carry them, so the unmasked fast paths pay no registers for them and the
  runtime sends score-modified calls to the masked variant): with ``softcap > 0`` the scaled scores become ``softcap *
  tanh(s / softcap)``; with ``has_alibi != 0`` ALiBi then adds ``-slope *
  |i + seqlen_k - seqlen_q - j|`` (per sequence, bottom-right aligned
  whatever ``bottom_right`` says, as flash-attn), the slope read at ``ALIBI +
  z * stride_az + h * stride_ah`` (fp32; ``stride_az = 0`` for per-head
  slopes), before the additive bias and the masks, so LSE is the
  logsumexp of the modified scores. The backward recomputes them and
  multiplies dS by ``1 - tanh^2`` (the slopes get no gradient; dBias is dS
  before that factor). The helpers live in ``score_mod``;
* ``UPCAST_DOT=True`` (CPU interpreter only) converts every dot operand to
  fp32 after that rounding, because the interpreter stores bf16 as raw
  uint16 and cannot multiply it (the interpreter's fp32 dot is exact fp32;
  compiled code always uses ``UPCAST_DOT=False``).

Each K/Q loop is split (with ``tl.static_range`` over "phases", so the loop body
is written once and specialised at compile time) into blocks that need no
masking along the sequence at all and the few blocks on the causal diagonal or
at the ragged end of the sequence, which are masked.

The kernels call no ``triton.language.standard`` function (``tl.zeros``,
``tl.cdiv``, ``tl.max``, ``tl.sum``, ...): the CPU path runs the kernel sources
in Triton's interpreter without TRITON_INTERPRET=1 at process start, so those
library functions are plain JIT functions there, which the interpreter cannot
call. Row reductions therefore use ``tl.reduce`` with the standard library's
combine functions, which the interpreter recognises and evaluates with numpy,
and which is exactly what ``tl.max``/``tl.sum`` lower to for fp32 inputs. Our
own helpers (``score_mod``) are fine: the interpreter backend imports this
package's modules with ``triton.knobs.runtime.interpret`` set, which makes
every ``@triton.jit`` function in them callable as a nested call (see
``aotriton_rocm.kernel_spec.interpreted_function``): ``philox`` and
``score_mod`` hold the device functions the kernels share. Integer divisions are only applied to
non-negative values (compiled code truncates, the interpreter floors).
"""

import triton
import triton.language as tl

from .philox import philox_uniform
from .score_mod import alibi_scores, alibi_slope, softcap_grad, softcap_scores

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2) = 1 / log2(e)


@triton.jit
def program_batch_head(num_heads, group):
    """This program's (zh, z, h), int32: program id 1 + program id 2 * (grid
    size 1) is ``zh = z * heads + h`` (see the module docstring), over
    ``heads = num_heads // group`` heads (the query heads with group 1, the
    key/value heads with group = gqa_group)."""
    zh = tl.program_id(1) + tl.program_id(2) * tl.num_programs(1)
    heads = num_heads // group
    return zh, zh // heads, zh % heads


@triton.jit
def packed_rows(CU, z, batch, max_seqlen, varlen, SIDE: tl.constexpr):
    """(start, seqlen) of batch entry ``z`` on one side (SIDE 0: Q, 1: K/V):
    rows ``CU[z] .. CU[z + 1]`` of a packed batch, placed apart by the side's
    STARTS/LENGTHS bits (see the module's conventions); (0, max_seqlen) of
    a dense one."""
    is_varlen = varlen != 0
    starts_apart = ((varlen >> (1 + 2 * SIDE)) & 1) != 0
    lengths_apart = ((varlen >> (2 + 2 * SIDE)) & 1) != 0
    first = tl.load(CU + z, mask=is_varlen, other=0)
    end = tl.load(CU + z + 1, mask=is_varlen & (lengths_apart == 0), other=0)
    start = tl.where(starts_apart, tl.load(CU + batch + 1 + z, mask=starts_apart, other=0), first)
    seqlen = tl.where(is_varlen, tl.where(lengths_apart, first, end - first), max_seqlen)
    return start, seqlen


@triton.jit
def batch_entry_sequence(CU_Q, CU_K, off_z32, batch, max_seqlen_q, max_seqlen_k, varlen):
    """Where batch entry ``off_z32`` (clamped to the last: the grid is rounded
    up) lies: rows [q_start, q_start + seqlen_q) and [k_start, k_start +
    seqlen_k) of a packed batch (varlen), or the dense tensors' own. Returns
    (z_last, q_start, k_start, seqlen_q, seqlen_k)."""
    z_last = tl.minimum(off_z32, batch - 1)
    q_start, seqlen_q = packed_rows(CU_Q, z_last, batch, max_seqlen_q, varlen, 0)
    k_start, seqlen_k = packed_rows(CU_K, z_last, batch, max_seqlen_k, varlen, 1)
    return z_last, q_start, k_start, seqlen_q, seqlen_k


@triton.jit
def query_program_sequence(CU_Q, CU_K, off_z32, start_m, batch, max_seqlen_q, max_seqlen_k, varlen):
    """The sequence of a program over query rows [start_m, start_m + BLOCK_M)
    of batch entry ``off_z32`` (see :func:`batch_entry_sequence`). Returns
    (z_last, q_start, k_start, seqlen_q, seqlen_k, seqlen_k - seqlen_q). A
    program past the batch or past its sequence's rows gets seqlen_k = 0 (it
    sees no key: its loops are empty and its stores masked); past the batch
    also seqlen_q = 0."""
    z_last, q_start, k_start, seqlen_q, seqlen_k = batch_entry_sequence(
        CU_Q, CU_K, off_z32, batch, max_seqlen_q, max_seqlen_k, varlen)
    diagonal = seqlen_k - seqlen_q
    live = (off_z32 < batch) & (start_m < seqlen_q)
    seqlen_q = tl.where(off_z32 < batch, seqlen_q, 0)
    seqlen_k = tl.where(live, seqlen_k, 0)
    return z_last, q_start, k_start, seqlen_q, seqlen_k, diagonal


@triton.jit
def key_program_sequence(CU_Q, CU_K, off_z32, start_n, batch, max_seqlen_q, max_seqlen_k, varlen, bottom_right):
    """The sequence of a program over key rows [start_n, start_n + BLOCK_N)
    of batch entry ``off_z32`` (see :func:`batch_entry_sequence`). Returns
    (z_last, q_start, k_start, seqlen_q, seqlen_k, causal_shift, seqlen_k -
    seqlen_q), the shifts of the whole sequence; past the batch seqlen_k =
    0, past the batch or past its sequence's keys seqlen_q = 0 (empty loops,
    masked stores)."""
    z_last, q_start, k_start, seqlen_q, seqlen_k = batch_entry_sequence(
        CU_Q, CU_K, off_z32, batch, max_seqlen_q, max_seqlen_k, varlen)
    diagonal = seqlen_k - seqlen_q
    causal_shift = bottom_right * diagonal
    seqlen_k = tl.where(off_z32 < batch, seqlen_k, 0)
    seqlen_q = tl.where(start_n < seqlen_k, seqlen_q, 0)
    return z_last, q_start, k_start, seqlen_q, seqlen_k, causal_shift, diagonal


@triton.jit
def batch_entry_rows(CU_Q, off_z32, batch, max_seqlen_q, varlen):
    """(z_last, q_start, seqlen_q) of batch entry ``off_z32`` for the kernels
    that only read query rows (see :func:`batch_entry_sequence`); seqlen_q
    = 0 past the batch."""
    z_last = tl.minimum(off_z32, batch - 1)
    q_start, seqlen_q = packed_rows(CU_Q, z_last, batch, max_seqlen_q, varlen, 0)
    return z_last, q_start, tl.where(off_z32 < batch, seqlen_q, 0)


@triton.jit
def heavy_first_row_block(BLOCK_M: tl.constexpr):
    """This program's first query row. Program id 0 counts the row blocks
    from the last: under a causal mask (either corner) a later block sees
    more keys, and the hardware starts programs in id order, so the longest
    ones run first and the short ones fill the end of the grid instead of a
    long one running alone there."""
    return (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M


@triton.jit
def row_ptr(T, z, h, row, stride_z, stride_h, stride_row):
    """T's address of row ``row`` of head ``h`` of batch entry ``z``, the
    offsets in int64 (program ids and strides are cast before they are
    multiplied)."""
    return T + z.to(tl.int64) * stride_z.to(tl.int64) + h.to(tl.int64) * stride_h.to(tl.int64) \
        + row.to(tl.int64) * stride_row.to(tl.int64)


@triton.jit
def row_masks(offs, seqlen, head_dim, BLOCK_D: tl.constexpr, PAD_HEAD: tl.constexpr):
    """The masks of a (rows, BLOCK_D) tile at sequence positions ``offs``:
    (offs_d, valid, d_valid, mask), where valid says offs < seqlen, d_valid
    d < head_dim, and mask is their product (valid alone without
    PAD_HEAD)."""
    offs_d = tl.arange(0, BLOCK_D)
    valid = offs < seqlen
    d_valid = offs_d < (head_dim // 8) * 8  # == head_dim; the form tells Triton masks come in runs of 8
    if PAD_HEAD:
        mask = valid[:, None] & d_valid[None, :]
    else:
        mask = valid[:, None]
    return offs_d, valid, d_valid, mask


@triton.jit
def philox_row(zh, start_m, max_seqlen_q, max_seqlen_k):
    """Index e of score (z, h, start_m, 0) in the (B, H, max_seqlen_q,
    max_seqlen_k) score matrix (``zh = z * H + h``), in int64: the low words
    of its Philox counter (see ``ENABLE_DROPOUT`` in the module docstring)."""
    return (zh.to(tl.int64) * max_seqlen_q + start_m) * max_seqlen_k


@triton.jit
def key_block_ranges(start_m, seqlen_q, seqlen_k, causal_shift, window_left, window_right,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The key blocks of a query block: row i sees columns [i + lo_shift,
    i + hi_shift] (see the module docstring); blocks [lo, hi) hold every
    column some row of the block sees, of them [f_lo, f_hi) are seen entirely
    by every row (no mask). Returns (lo_shift, hi_shift, lo, hi, f_lo, f_hi)."""
    hi_shift = tl.where(window_right < 0, seqlen_k, causal_shift + window_right)
    lo_shift = tl.where(window_left < 0, -seqlen_q, causal_shift - window_left)
    n_full = (seqlen_k // BLOCK_N) * BLOCK_N
    lo = (tl.maximum(start_m + lo_shift, 0) // BLOCK_N) * BLOCK_N
    hi = tl.maximum(tl.minimum(start_m + BLOCK_M + hi_shift, seqlen_k), lo)
    f_lo = tl.minimum(tl.maximum(
        ((tl.maximum(start_m + BLOCK_M - 1 + lo_shift, 0) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, lo), hi)
    f_hi = tl.maximum(tl.minimum((tl.maximum(start_m + hi_shift + 1, 0) // BLOCK_N) * BLOCK_N, n_full),
                      f_lo)
    return lo_shift, hi_shift, lo, hi, f_lo, f_hi


@triton.jit
def query_block_ranges(start_n, seqlen_q, seqlen_k, causal_shift, window_left, window_right,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The query blocks of a key block, the transpose of
    :func:`key_block_ranges`: row i sees key j iff j - hi_shift <= i <= j -
    lo_shift; blocks [lo, up) hold every row that sees some key of the block,
    of them [f_lo, f_hi) see every key of it (no mask). Returns (lo_shift,
    hi_shift, lo, up, f_lo, f_hi)."""
    hi_shift = tl.where(window_right < 0, seqlen_k, causal_shift + window_right)
    lo_shift = tl.where(window_left < 0, -seqlen_q, causal_shift - window_left)
    m_full = (seqlen_q // BLOCK_M) * BLOCK_M
    lo = (tl.maximum(start_n - hi_shift, 0) // BLOCK_M) * BLOCK_M
    up = tl.maximum(tl.minimum(start_n + BLOCK_N - lo_shift, seqlen_q), lo)
    f_lo = tl.minimum(tl.maximum(
        ((tl.maximum(start_n + BLOCK_N - 1 - hi_shift, 0) + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, lo), up)
    f_hi = tl.maximum(tl.minimum((tl.maximum(start_n - lo_shift + 1, 0) // BLOCK_M) * BLOCK_M, m_full),
                      f_lo)
    return lo_shift, hi_shift, lo, up, f_lo, f_hi


@triton.jit
def phase_bounds(lo, hi, f_lo, f_hi, phase: tl.constexpr):
    """The loop bounds of a phase over the blocks [lo, hi): phase 0 walks
    the unmasked blocks [f_lo, f_hi), phase 1 the masked blocks [lo, f_lo)
    and [f_hi, hi) as one range (x >= f_lo jumps over the unmasked blocks)."""
    if phase == 0:
        return f_lo, f_hi
    else:
        return lo, hi - (f_hi - f_lo)


@triton.jit
def visible_keys(rows, cols, seqlen_k, lo_shift, hi_shift):
    """The (rows, cols) mask of the scores a masked block keeps: real keys
    in each row's window [row + lo_shift, row + hi_shift]."""
    return (cols < seqlen_k)[None, :] & (cols[None, :] <= (rows + hi_shift)[:, None]) \
        & (cols[None, :] >= (rows + lo_shift)[:, None])


@triton.jit
def load_seq_block(blk, offs, seq, seqlen, d_valid, phase: tl.constexpr, PAD_HEAD: tl.constexpr):
    """A (rows, BLOCK_D) block of a loop over the sequence (K or V of a key
    loop, Q or dO of a query loop) at positions ``seq``: whole blocks in the
    first phase, masked by ``seq < seqlen`` in the second; masked by head
    dim where padded."""
    if phase == 0:
        if PAD_HEAD:
            return tl.load(blk + offs, mask=d_valid[None, :], other=0.0)
        else:
            return tl.load(blk + offs)
    else:
        mask = (seq < seqlen)[:, None]
        if PAD_HEAD:
            mask = mask & d_valid[None, :]
        return tl.load(blk + offs, mask=mask, other=0.0)


@triton.jit
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
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAD_HEAD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ENABLE_DROPOUT: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    PRE_LOAD_V: tl.constexpr = False,
):
    start_m = heavy_first_row_block(BLOCK_M)
    off_zh, off_z32, off_h32 = program_batch_head(num_heads, 1)
    off_z = off_z32.to(tl.int64)
    off_h = off_h32.to(tl.int64)
    off_hk = (off_h32 // gqa_group).to(tl.int64)

    z_last, q_start, k_start, seqlen_q, seqlen_k, diagonal = query_program_sequence(
        CU_Q, CU_K, off_z32, start_m, batch, max_seqlen_q, max_seqlen_k, varlen)
    causal_shift = bottom_right * diagonal
    alibi_shift = diagonal  # ALiBi is bottom-right aligned, whatever the mask's alignment

    # Scalar int64 base pointers (this head, this query block); the offsets
    # inside one block are small and stay int32.
    m_off64 = tl.cast(q_start + start_m, tl.int64)
    q_blk = row_ptr(Q, off_z, off_h, m_off64, stride_qz, stride_qh, stride_qm)
    o_blk = row_ptr(O, off_z, off_h, m_off64, stride_oz, stride_oh, stride_om)
    k_base = row_ptr(K, off_z, off_hk, k_start, stride_kz, stride_kh, stride_kn)
    v_base = row_ptr(V, off_z, off_hk, k_start, stride_vz, stride_vh, stride_vn)
    stride_kn64 = stride_kn.to(tl.int64)
    stride_vn64 = stride_vn.to(tl.int64)

    offs_m0 = tl.arange(0, BLOCK_M)
    offs_m = start_m + offs_m0
    offs_n = tl.arange(0, BLOCK_N)
    offs_d, m_valid, d_valid, q_mask = row_masks(offs_m, seqlen_q, head_dim, BLOCK_D, PAD_HEAD)

    q = tl.load(q_blk + (offs_m0[:, None] * stride_qm + offs_d[None, :]), mask=q_mask, other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)
    k_offs = offs_n[:, None] * stride_kn + offs_d[None, :]
    v_offs = offs_n[:, None] * stride_vn + offs_d[None, :]
    if HAS_BIAS:
        b_blk = row_ptr(BIAS, off_z, off_h, m_off64, stride_bz, stride_bh, stride_bm)
    if ENABLE_DROPOUT:
        seed = tl.load(RNG_SEED)
        # Element (z, h, i, j) of the (B, H, max_seqlen_q, max_seqlen_k)
        # score matrix has the index e = ((z * H + h) * max_seqlen_q + i) *
        # max_seqlen_k + j; its Philox counter is (e, RNG_OFFSET), and e is
        # where the debug mask stores it.
        rng_row = philox_row(off_zh, start_m, max_seqlen_q, max_seqlen_k)
        rng_offset = tl.load(RNG_OFFSET)
        drop_scale = 1.0 / (1.0 - dropout_p)

    qk_scale = sm_scale * LOG2E
    # Without score modifiers the raw scores go straight into the softmax and
    # the scale rides on its subtraction: max(s) * c = max(s * c) for c > 0,
    # and s * c - m is one fused multiply-add, where scaling the tile first
    # costs a multiply per score (the fast paths are bound by this
    # elementwise work at head dims 64 and 128 on the H100).
    if PAD_HEAD or HAS_BIAS:
        exp_scale = 1.0
    else:
        exp_scale = qk_scale
    # Softcap and ALiBi slope in the scores' log2 units (see score_mod).
    cap2 = softcap * LOG2E
    slope2 = alibi_slope(ALIBI, stride_az, stride_ah, z_last, off_h32, has_alibi) * LOG2E
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)

    lo_shift, hi_shift, lo, hi, f_lo, f_hi = key_block_ranges(
        start_m, seqlen_q, seqlen_k, causal_shift, window_left, window_right, BLOCK_M, BLOCK_N)

    for phase in tl.static_range(2):
        lo_p, up_p = phase_bounds(lo, hi, f_lo, f_hi, phase)
        for start_x in range(lo_p, up_p, BLOCK_N):
            # (the multiple_of hint stays in the kernel: set in a helper, on its
            # argument or its result, it would be lost when the helper is inlined)
            if phase == 0:
                start_n = start_x
            else:
                start_n = start_x + (start_x >= f_lo).to(tl.int32) * (f_hi - f_lo)
            start_n = tl.multiple_of(start_n, BLOCK_N)
            cols = start_n + offs_n
            n_off64 = tl.cast(start_n, tl.int64)
            k = load_seq_block(k_base + n_off64 * stride_kn64, k_offs, cols, seqlen_k, d_valid, phase, PAD_HEAD)
            if UPCAST_DOT:
                k = k.to(tl.float32)
            if PRE_LOAD_V:
                # AMD's early V load: V's load issues before the QK dot, its
                # latency hidden behind the dot and the softmax.
                v = load_seq_block(v_base + n_off64 * stride_vn64, v_offs, cols, seqlen_k, d_valid,
                                   phase, PAD_HEAD)
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
            if PAD_HEAD or HAS_BIAS:
                # Score modifiers work on the scaled scores.
                qk = qk * qk_scale
            if PAD_HEAD:
                if softcap > 0.0:
                    qk = softcap_scores(qk, cap2)
            if HAS_BIAS:
                b_mask = m_valid[:, None]
                if phase == 1:
                    b_mask = b_mask & (cols < seqlen_k)[None, :]
                bias = tl.load(b_blk + (offs_m0[:, None] * stride_bm + cols[None, :]), mask=b_mask,
                               other=0.0)
                qk = qk + bias.to(tl.float32) * LOG2E
            if PAD_HEAD:
                if has_alibi != 0:
                    qk = alibi_scores(qk, slope2, offs_m[:, None], cols[None, :], alibi_shift)
            if phase == 1:
                qk = tl.where(visible_keys(offs_m, cols, seqlen_k, lo_shift, hi_shift), qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.reduce(qk, 1, tl.standard._elementwise_max) * exp_scale)
            if phase == 1 or HAS_BIAS:
                # A row may have seen no key yet (m_new = -inf): shift by 0
                # instead, so that p = alpha = 0 rather than NaN.
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            else:
                # Unmasked blocks come first and every row sees all of them: m_new is finite.
                m_use = m_new
            p = tl.math.exp2(qk * exp_scale - m_use[:, None])
            alpha = tl.math.exp2(m_i - m_use)
            l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
            acc = acc * alpha[:, None]
            if not PRE_LOAD_V:
                v = load_seq_block(v_base + n_off64 * stride_vn64, v_offs, cols, seqlen_k, d_valid,
                                   phase, PAD_HEAD)
            if ENABLE_DROPOUT:
                # the element's draw at its counter (philox.py)
                inner = offs_m0[:, None] * max_seqlen_k + cols[None, :]
                cnt = rng_row + inner
                kept = philox_uniform(seed, rng_offset, cnt) > dropout_p
                if store_dmask != 0:
                    # The debug mask: the unnormalised probability, negated where dropped.
                    tl.store(DMASK + rng_row + inner, tl.where(kept, p, -p).to(
                        DMASK.dtype.element_ty), mask=m_valid[:, None] & (cols < seqlen_k)[None, :])
                # Unscaled: 1 / (1 - p) multiplies the fp32 output at the end
                # (p = 1 at each row's maximum, and fp16(1 / (1 - p)) is not
                # 1 / (1 - p): scaled here, every row would lean one way).
                p_lp = tl.where(kept, p, 0.0).to(V.dtype.element_ty)
            else:
                p_lp = p.to(V.dtype.element_ty)
            if UPCAST_DOT:
                p_lp = p_lp.to(tl.float32)
                v = v.to(tl.float32)
            acc = tl.dot(p_lp, v, acc, input_precision="ieee")
            m_i = m_new

    # Rows that see no key: output 0, LSE +inf.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    inv_l = 1.0 / l_safe
    if ENABLE_DROPOUT:
        inv_l = inv_l * drop_scale
    acc = acc * inv_l[:, None]
    tl.store(o_blk + (offs_m0[:, None] * stride_om + offs_d[None, :]), acc.to(O.dtype.element_ty),
             mask=q_mask)
    lse_ptrs = LSE + off_z * stride_lz + off_h * stride_lh + q_start + offs_m
    tl.store(lse_ptrs, lse, mask=m_valid)


@triton.jit
def attn_bwd_preprocess(
    O, DO, Delta, CU_Q,
    stride_oz, stride_oh, stride_om,
    stride_doz, stride_doh, stride_dom,
    stride_lz, stride_lh,
    batch, num_heads, max_seqlen_q, varlen, head_dim,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    _, off_z32, off_h32 = program_batch_head(num_heads, 1)
    off_z = off_z32.to(tl.int64)
    off_h = off_h32.to(tl.int64)
    _, q_start, seqlen_q = batch_entry_rows(CU_Q, off_z32, batch, max_seqlen_q, varlen)
    # Memory-bound and run once per backward: always masked along d (the mask
    # comes in runs of 8 elements, so loads stay 16-byte vectors).
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_m = start_m + offs_m0
    offs_d, m_valid, _, mask = row_masks(offs_m, seqlen_q, head_dim, BLOCK_D, True)
    m_off64 = tl.cast(q_start + start_m, tl.int64)

    o_blk = row_ptr(O, off_z, off_h, m_off64, stride_oz, stride_oh, stride_om)
    do_blk = row_ptr(DO, off_z, off_h, m_off64, stride_doz, stride_doh, stride_dom)
    o = tl.load(o_blk + (offs_m0[:, None] * stride_om + offs_d[None, :]),
                mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_blk + (offs_m0[:, None] * stride_dom + offs_d[None, :]),
                 mask=mask, other=0.0).to(tl.float32)
    delta = tl.reduce(o * do, 1, tl.standard._sum_combine)
    tl.store(Delta + off_z * stride_lz + off_h * stride_lh + q_start + offs_m, delta, mask=m_valid)


@triton.jit
def attn_bwd_dq_convert(
    DQ_ACC, DQ, CU_Q,
    stride_dqaz, stride_dqah, stride_dqam,
    stride_dqz, stride_dqh, stride_dqm,
    batch, num_heads, max_seqlen_q, varlen, head_dim, sm_scale,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """dQ = sm_scale * the fp32 sum ``flash_attention_sm90_bwd_fused`` added
    up in ``DQ_ACC`` (strided like dQ), in dQ's dtype."""
    start_m = tl.program_id(0) * BLOCK_M
    _, off_z32, off_h32 = program_batch_head(num_heads, 1)
    off_z = off_z32.to(tl.int64)
    off_h = off_h32.to(tl.int64)
    _, q_start, seqlen_q = batch_entry_rows(CU_Q, off_z32, batch, max_seqlen_q, varlen)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = ((start_m + offs_m) < seqlen_q)[:, None] & (offs_d < head_dim)[None, :]
    m_off64 = tl.cast(q_start + start_m, tl.int64)
    acc = tl.load(row_ptr(DQ_ACC, off_z, off_h, m_off64, stride_dqaz, stride_dqah, stride_dqam)
                  + (offs_m[:, None] * stride_dqam + offs_d[None, :]), mask=mask, other=0.0)
    tl.store(row_ptr(DQ, off_z, off_h, m_off64, stride_dqz, stride_dqh, stride_dqm)
             + (offs_m[:, None] * stride_dqm + offs_d[None, :]), (acc * sm_scale).to(DQ.dtype.element_ty),
             mask=mask)


@triton.jit
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
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAD_HEAD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ENABLE_DROPOUT: tl.constexpr,
    SPLIT_DKDV: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    # One program per key block of one key/value head; it loops over the
    # gqa_group query heads that read this head. With SPLIT_DKDV it sweeps
    # them twice, for dV and then for dK, so that one BLOCK_N x BLOCK_D fp32
    # accumulator is live instead of two: at head dim 256 the pair does not
    # fit in registers and spills in every tile. The second sweep recomputes
    # P (one more dot per block: 5 instead of 4), cheaper than the spills.
    start_n = tl.program_id(0) * BLOCK_N
    _, off_z32, off_hk32 = program_batch_head(num_heads, gqa_group)
    off_z = off_z32.to(tl.int64)
    off_hk = off_hk32.to(tl.int64)

    z_last, q_start, k_start, seqlen_q, seqlen_k, causal_shift, alibi_shift = key_program_sequence(
        CU_Q, CU_K, off_z32, start_n, batch, max_seqlen_q, max_seqlen_k, varlen, bottom_right)

    # Scalar int64 base pointers; offsets inside one block stay int32.
    n_off64 = tl.cast(k_start + start_n, tl.int64)
    k_blk = row_ptr(K, off_z, off_hk, n_off64, stride_kz, stride_kh, stride_kn)
    v_blk = row_ptr(V, off_z, off_hk, n_off64, stride_vz, stride_vh, stride_vn)
    dk_blk = row_ptr(DK, off_z, off_hk, n_off64, stride_dkz, stride_dkh, stride_dkn)
    dv_blk = row_ptr(DV, off_z, off_hk, n_off64, stride_dvz, stride_dvh, stride_dvn)
    stride_qm64 = stride_qm.to(tl.int64)
    stride_dom64 = stride_dom.to(tl.int64)
    q_start64 = tl.cast(q_start, tl.int64)

    offs_n0 = tl.arange(0, BLOCK_N)
    offs_n = start_n + offs_n0
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d, n_valid, d_valid, kv_mask = row_masks(offs_n, seqlen_k, head_dim, BLOCK_D, PAD_HEAD)

    k = tl.load(k_blk + (offs_n0[:, None] * stride_kn + offs_d[None, :]), mask=kv_mask, other=0.0)
    if UPCAST_DOT:
        k = k.to(tl.float32)
    q_offs = offs_m0[:, None] * stride_qm + offs_d[None, :]
    do_offs = offs_m0[:, None] * stride_dom + offs_d[None, :]
    if ENABLE_DROPOUT:
        seed = tl.load(RNG_SEED)
        rng_offset = tl.load(RNG_OFFSET)
        drop_scale = 1.0 / (1.0 - dropout_p)

    qk_scale = sm_scale * LOG2E
    cap2 = softcap * LOG2E

    # Row i sees this block's key j iff j - hi_shift <= i <= j - lo_shift
    # (see the module docstring). Q blocks [lo, up) hold every row that sees
    # some key of this block; of them [f_lo, f_hi) are complete and see every
    # key of this block (unmasked); the rest, [lo, f_lo) and [f_hi, up) (the
    # window edges, the causal diagonal, the ragged tail), are masked. Key
    # columns >= seqlen_k only feed rows of dK/dV that are never stored, so
    # they need no mask (but for the bias, which is not read out of bounds).
    lo_shift, hi_shift, lo, up, f_lo, f_hi = query_block_ranges(
        start_n, seqlen_q, seqlen_k, causal_shift, window_left, window_right, BLOCK_M, BLOCK_N)

    # Sweep `part` accumulates dV when part == 0 and dK when part ==
    # SPLIT_DKDV: both in one sweep, or dV in the first and dK in the second.
    # (The conditions are spelled out at each use: Triton 3.9 loses the
    # accumulators of loops nested under a local name bound to a constexpr.)
    for part in tl.static_range(1 + SPLIT_DKDV):
        if part == 0:
            dv = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
        if part == SPLIT_DKDV:
            dk = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
            v = tl.load(v_blk + (offs_n0[:, None] * stride_vn + offs_d[None, :]), mask=kv_mask,
                        other=0.0)
            if UPCAST_DOT:
                v = v.to(tl.float32)
        for g in range(0, gqa_group):
            off_h = off_hk * gqa_group + g
            off_zh = off_z * num_heads + off_h
            q_base = row_ptr(Q, off_z, off_h, q_start64, stride_qz, stride_qh, stride_qm)
            do_base = row_ptr(DO, off_z, off_h, q_start64, stride_doz, stride_doh, stride_dom)
            lse_base = LSE + off_z * stride_lz + off_h * stride_lh + q_start
            delta_base = Delta + off_z * stride_lz + off_h * stride_lh + q_start
            slope2 = alibi_slope(ALIBI, stride_az, stride_ah, z_last, off_h, has_alibi) * LOG2E
            if HAS_BIAS:
                b_base = row_ptr(BIAS, off_z, off_h, q_start64, stride_bz, stride_bh, stride_bm) + start_n
            if ENABLE_DROPOUT:
                # See attn_fwd: the counter of (z, h, i, j) is (e, RNG_OFFSET).
                rng_head = off_zh.to(tl.int64) * max_seqlen_q * max_seqlen_k + start_n
            for phase in tl.static_range(2):
                lo_p, hi_p = phase_bounds(lo, up, f_lo, f_hi, phase)
                # Split sweeps also rebuild their (BLOCK_M, BLOCK_D) address
                # tiles in each block instead of holding them in registers
                # across the loop (no hoisting): at head dim 256 that is
                # what lets the dK/dV tiles fit without spills on sm_90.
                for start_x in tl.range(lo_p, hi_p, BLOCK_M, disable_licm=SPLIT_DKDV):
                    if phase == 0:
                        start_m = start_x
                    else:
                        start_m = start_x + (start_x >= f_lo).to(tl.int32) * (f_hi - f_lo)
                    start_m = tl.multiple_of(start_m, BLOCK_M)
                    rows = start_m + offs_m0
                    m_off64 = tl.cast(start_m, tl.int64)
                    q_blk = q_base + m_off64 * stride_qm64
                    do_blk = do_base + m_off64 * stride_dom64
                    q = load_seq_block(q_blk, q_offs, rows, seqlen_q, d_valid, phase, PAD_HEAD)
                    do = load_seq_block(do_blk, do_offs, rows, seqlen_q, d_valid, phase, PAD_HEAD)
                    if phase == 0:
                        lse = tl.load(lse_base + rows)
                        delta = tl.load(delta_base + rows)
                    else:
                        r_valid = rows < seqlen_q
                        # lse = +inf makes P exactly 0 on padded query rows.
                        lse = tl.load(lse_base + rows, mask=r_valid, other=float("inf"))
                        delta = tl.load(delta_base + rows, mask=r_valid, other=0.0)
                    if UPCAST_DOT:
                        q = q.to(tl.float32)
                        do = do.to(tl.float32)
                    # Transposed scores: (BLOCK_N, BLOCK_M).
                    qkT = tl.dot(k, tl.trans(q), input_precision="ieee") * qk_scale
                    if PAD_HEAD:
                        if softcap > 0.0:
                            qkT = softcap_scores(qkT, cap2)
                    cappedT = qkT
                    if HAS_BIAS:
                        bT = tl.load(b_base + (rows[None, :] * stride_bm + offs_n0[:, None]),
                                     mask=(rows < seqlen_q)[None, :] & n_valid[:, None], other=0.0)
                        qkT = qkT + bT.to(tl.float32) * LOG2E
                    if PAD_HEAD:
                        if has_alibi != 0:
                            qkT = alibi_scores(qkT, slope2, rows[None, :], offs_n[:, None], alibi_shift)
                    pT = tl.math.exp2(qkT - (lse * LOG2E)[None, :])
                    if phase == 1:
                        pT = tl.where(((rows + hi_shift)[None, :] >= offs_n[:, None])
                                      & ((rows + lo_shift)[None, :] <= offs_n[:, None]), pT, 0.0)
                    # (dP's dot is issued before dV's: the order the
                    # unsplit kernel was measured fastest in.)
                    if part == SPLIT_DKDV:
                        dpT = tl.dot(v, tl.trans(do), input_precision="ieee")
                    if ENABLE_DROPOUT:
                        # The forward's Philox draw of each element (see attn_fwd).
                        cnt = rng_head + m_off64 * max_seqlen_k + (offs_m0[None, :] * max_seqlen_k
                                                                     + offs_n0[:, None])
                        kept = philox_uniform(seed, rng_offset, cnt) > dropout_p
                        if part == SPLIT_DKDV:
                            dpT = tl.where(kept, dpT * drop_scale, 0.0)
                    if part == 0:
                        if ENABLE_DROPOUT:
                            # (scaled by 1 / (1 - p) in fp32 at the store, as the forward)
                            pT_lp = tl.where(kept, pT, 0.0).to(DO.dtype.element_ty)
                        else:
                            pT_lp = pT.to(DO.dtype.element_ty)
                        if UPCAST_DOT:
                            pT_lp = pT_lp.to(tl.float32)
                        dv = tl.dot(pT_lp, do, dv, input_precision="ieee")
                    if part == SPLIT_DKDV:
                        dsT = pT * (dpT - delta[None, :])
                        if PAD_HEAD:
                            if softcap > 0.0:
                                dsT = softcap_grad(dsT, cappedT, cap2)
                        dsT_lp = dsT.to(Q.dtype.element_ty)
                        if UPCAST_DOT:
                            dsT_lp = dsT_lp.to(tl.float32)
                        dk = tl.dot(dsT_lp, q, dk, input_precision="ieee")

        if part == SPLIT_DKDV:
            dk = dk * sm_scale
            tl.store(dk_blk + (offs_n0[:, None] * stride_dkn + offs_d[None, :]),
                     dk.to(DK.dtype.element_ty), mask=kv_mask)
        if part == 0:
            if ENABLE_DROPOUT:
                dv = dv * drop_scale
            tl.store(dv_blk + (offs_n0[:, None] * stride_dvn + offs_d[None, :]),
                     dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def attn_bwd_dq(
    Q, K, V, BIAS, DO, LSE, Delta, DQ, DBIAS, CU_Q, CU_K, RNG_SEED, RNG_OFFSET,
    stride_qz, stride_qh, stride_qm,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_bz, stride_bh, stride_bm,
    stride_doz, stride_doh, stride_dom,
    stride_dqz, stride_dqh, stride_dqm,
    stride_dbz, stride_dbh, stride_dbm,
    stride_lz, stride_lh,
    batch, num_heads, gqa_group, max_seqlen_q, max_seqlen_k, varlen, head_dim,
    bottom_right, window_left, window_right, sm_scale, dropout_p, store_dbias,
    ALIBI, stride_az, stride_ah, has_alibi, softcap,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAD_HEAD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ENABLE_DROPOUT: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    start_m = heavy_first_row_block(BLOCK_M)
    off_zh, off_z32, off_h32 = program_batch_head(num_heads, 1)
    off_z = off_z32.to(tl.int64)
    off_h = off_h32.to(tl.int64)
    off_hk = (off_h32 // gqa_group).to(tl.int64)

    z_last, q_start, k_start, seqlen_q, seqlen_k, diagonal = query_program_sequence(
        CU_Q, CU_K, off_z32, start_m, batch, max_seqlen_q, max_seqlen_k, varlen)
    causal_shift = bottom_right * diagonal
    alibi_shift = diagonal

    # Scalar int64 base pointers; offsets inside one block stay int32.
    m_off64 = tl.cast(q_start + start_m, tl.int64)
    q_blk = row_ptr(Q, off_z, off_h, m_off64, stride_qz, stride_qh, stride_qm)
    do_blk = row_ptr(DO, off_z, off_h, m_off64, stride_doz, stride_doh, stride_dom)
    dq_blk = row_ptr(DQ, off_z, off_h, m_off64, stride_dqz, stride_dqh, stride_dqm)
    k_base = row_ptr(K, off_z, off_hk, k_start, stride_kz, stride_kh, stride_kn)
    v_base = row_ptr(V, off_z, off_hk, k_start, stride_vz, stride_vh, stride_vn)
    stride_kn64 = stride_kn.to(tl.int64)
    stride_vn64 = stride_vn.to(tl.int64)

    offs_m0 = tl.arange(0, BLOCK_M)
    offs_m = start_m + offs_m0
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d, m_valid, d_valid, q_mask = row_masks(offs_m, seqlen_q, head_dim, BLOCK_D, PAD_HEAD)

    q = tl.load(q_blk + (offs_m0[:, None] * stride_qm + offs_d[None, :]), mask=q_mask, other=0.0)
    do = tl.load(do_blk + (offs_m0[:, None] * stride_dom + offs_d[None, :]), mask=q_mask, other=0.0)
    row_stats = off_z * stride_lz + off_h * stride_lh + q_start + offs_m
    lse = tl.load(LSE + row_stats, mask=m_valid, other=0.0)
    delta = tl.load(Delta + row_stats, mask=m_valid, other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse2 = lse * LOG2E
    k_offs = offs_n0[:, None] * stride_kn + offs_d[None, :]
    v_offs = offs_n0[:, None] * stride_vn + offs_d[None, :]
    if HAS_BIAS:
        b_blk = row_ptr(BIAS, off_z, off_h, m_off64, stride_bz, stride_bh, stride_bm)
        db_blk = row_ptr(DBIAS, off_z, off_h, m_off64, stride_dbz, stride_dbh, stride_dbm)
    if ENABLE_DROPOUT:
        seed = tl.load(RNG_SEED)
        # See attn_fwd: the counter of (z, h, i, j) is (e, RNG_OFFSET).
        rng_offset = tl.load(RNG_OFFSET)
        rng_row = philox_row(off_zh, start_m, max_seqlen_q, max_seqlen_k)
        drop_scale = 1.0 / (1.0 - dropout_p)

    qk_scale = sm_scale * LOG2E
    cap2 = softcap * LOG2E
    slope2 = alibi_slope(ALIBI, stride_az, stride_ah, z_last, off_h32, has_alibi) * LOG2E
    dq = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)

    # Masking the padded key columns matters here: with K = 0 there, P =
    # exp(-lse) can overflow and inf * 0 would poison dQ. Rows that see no
    # key have LSE = +inf, so their P is 0.
    lo_shift, hi_shift, lo, hi, f_lo, f_hi = key_block_ranges(
        start_m, seqlen_q, seqlen_k, causal_shift, window_left, window_right, BLOCK_M, BLOCK_N)

    for phase in tl.static_range(2):
        lo_p, up_p = phase_bounds(lo, hi, f_lo, f_hi, phase)
        for start_x in range(lo_p, up_p, BLOCK_N):
            if phase == 0:
                start_n = start_x
            else:
                start_n = start_x + (start_x >= f_lo).to(tl.int32) * (f_hi - f_lo)
            start_n = tl.multiple_of(start_n, BLOCK_N)
            cols = start_n + offs_n0
            n_off64 = tl.cast(start_n, tl.int64)
            k_blk = k_base + n_off64 * stride_kn64
            v_blk = v_base + n_off64 * stride_vn64
            k = load_seq_block(k_blk, k_offs, cols, seqlen_k, d_valid, phase, PAD_HEAD)
            v = load_seq_block(v_blk, v_offs, cols, seqlen_k, d_valid, phase, PAD_HEAD)
            if UPCAST_DOT:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
            if PAD_HEAD:
                if softcap > 0.0:
                    qk = softcap_scores(qk, cap2)
            capped = qk
            if HAS_BIAS:
                b_mask = m_valid[:, None] & (cols < seqlen_k)[None, :]
                bias = tl.load(b_blk + (offs_m0[:, None] * stride_bm + cols[None, :]), mask=b_mask,
                               other=0.0)
                qk = qk + bias.to(tl.float32) * LOG2E
            if PAD_HEAD:
                if has_alibi != 0:
                    qk = alibi_scores(qk, slope2, offs_m[:, None], cols[None, :], alibi_shift)
            p = tl.math.exp2(qk - lse2[:, None])
            if phase == 1:
                p = tl.where(visible_keys(offs_m, cols, seqlen_k, lo_shift, hi_shift), p, 0.0)
            if not HAS_BIAS:
                if PAD_HEAD:
                    if softcap > 0.0:
                        # dS is linear in P: fold the tanh derivative in now, so
                        # that the capped scores are not kept across the dP dot.
                        p = softcap_grad(p, capped, cap2)
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
            if ENABLE_DROPOUT:
                # The forward's Philox draw of each element (see attn_fwd).
                cnt = rng_row + (offs_m0[:, None] * max_seqlen_k + cols[None, :])
                kept = philox_uniform(seed, rng_offset, cnt) > dropout_p
                dp = tl.where(kept, dp * drop_scale, 0.0)
            ds = p * (dp - delta[:, None])
            if HAS_BIAS:
                if store_dbias != 0:
                    # d(loss)/d(bias) is dS itself (the bias adds to the scaled scores).
                    tl.store(db_blk + (offs_m0[:, None] * stride_dbm + cols[None, :]),
                             ds.to(DBIAS.dtype.element_ty),
                             mask=m_valid[:, None] & (cols < seqlen_k)[None, :])
                if PAD_HEAD:
                    if softcap > 0.0:
                        # after dBias, which is the gradient of the capped scores
                        ds = softcap_grad(ds, capped, cap2)
            ds_lp = ds.to(K.dtype.element_ty)
            if UPCAST_DOT:
                ds_lp = ds_lp.to(tl.float32)
            dq = tl.dot(ds_lp, k, dq, input_precision="ieee")

    dq = dq * sm_scale
    tl.store(dq_blk + (offs_m0[:, None] * stride_dqm + offs_d[None, :]), dq.to(DQ.dtype.element_ty),
             mask=q_mask)


@triton.jit
def dropout_uniform(
    R, RNG_SEED, RNG_OFFSET,
    batch, num_heads, max_seqlen_q, max_seqlen_k, dropout_p, encode_keep,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The attention kernels' dropout draws, written to R: a contiguous fp32
    (batch, num_heads, max_seqlen_q, max_seqlen_k) tensor whose element e
    gets the draw u of Philox counter (e, RNG_OFFSET) (see ``ENABLE_DROPOUT``
    in the module docstring: u in (0, 1], kept iff u > dropout_p). With
    ``encode_keep`` it writes 0.5 where the element is kept and -0.5 where
    it is dropped instead (torch's ROCm encoding of the same mask)."""
    start_m = tl.program_id(0) * BLOCK_M
    off_zh, _, _ = program_batch_head(num_heads, 1)
    # Programs past batch * heads (the grid is rounded up) store nothing.
    rows = tl.where(off_zh < batch * num_heads, max_seqlen_q, 0)
    seed = tl.load(RNG_SEED)
    elem_row = philox_row(off_zh, start_m, max_seqlen_q, max_seqlen_k)
    rng_offset = tl.load(RNG_OFFSET)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    row_ok = start_m + offs_m0 < rows
    for start_n in range(0, max_seqlen_k, BLOCK_N):
        cols = start_n + offs_n
        inner = offs_m0[:, None] * max_seqlen_k + cols[None, :]
        cnt = elem_row + inner
        u = philox_uniform(seed, rng_offset, cnt)
        if encode_keep != 0:
            u = tl.where(u > dropout_p, 0.5, -0.5)
        tl.store(R + elem_row + inner, u, mask=row_ok[:, None] & (cols < max_seqlen_k)[None, :])
