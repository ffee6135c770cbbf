"""Score modifications shared by the attention kernels: softcap and ALiBi.

flash-attn 2.8's order, applied to each score tile before the masks and the
softmax: ``s = sm_scale * q.k``; with a softcap ``c > 0``, ``s = c * tanh(s /
c)``; then ALiBi adds ``-slope * |i + seqlen_k - seqlen_q - j|`` (query row
``i``, key column ``j``, seqlens of the sequence: per sequence in a
variable-length batch), whatever the causal alignment; then an additive bias
and the causal / window masks.

Every helper works in the units its caller's scores are in: the kernels keep
scores in the log2 domain (multiplied by ``log2(e)``), so they pass the
softcap and the slope multiplied by ``log2(e)`` too (``c * tanh(s / c)`` and
the ALiBi term are both linear in that factor). Tiles are fp32; index tiles
are int32 and may be laid out either way round (the backward's dK/dV kernel
holds transposed (key, query) tiles): pass ``q_pos`` and ``k_pos`` already
broadcast against each other.

These are ``@triton.jit`` device functions: the compiled kernels inline them,
and the CPU interpreter runs them as nested calls because the interpreter
backend imports the kernel sources with ``triton.knobs.runtime.interpret``
set (see ``aotriton_rocm.kernel_spec.interpreted_function``).
"""

import triton
import triton.language as tl

# -2 * log2(e): exp(-2x) == exp2(x * NEG_2_LOG2E)
NEG_2_LOG2E = tl.constexpr(-2.8853900817779268)


@triton.jit
def softcap_scores(scores, cap):
    """``cap * tanh(scores / cap)``, elementwise (``cap > 0``, same units).

    tanh from exp2 (no libdevice: the same code runs on HIP, CUDA and the
    interpreter): ``tanh(|x|) = (1 - e) / (1 + e)`` with ``e = exp(-2|x|)``
    in (0, 1], so nothing overflows; absolute error about 1 ulp of 1.
    """
    x = scores / cap
    e = tl.math.exp2(tl.abs(x) * NEG_2_LOG2E)
    t = (1.0 - e) / (1.0 + e)
    return cap * tl.where(x < 0.0, -t, t)


@triton.jit
def softcap_grad(ds, capped, cap):
    """The gradient of the raw scores from that of the capped ones:
    ``ds * (1 - tanh^2)``, ``tanh = capped / cap`` (``capped`` as returned by
    :func:`softcap_scores` with the same ``cap``)."""
    t = capped / cap
    return ds * (1.0 - t * t)


@triton.jit
def alibi_slope(ALIBI, stride_az, stride_ah, off_z, off_h, has_alibi):
    """The fp32 slope of (sequence ``off_z``, head ``off_h``): ``ALIBI[off_z *
    stride_az + off_h * stride_ah]`` (``stride_az = 0`` for per-head (H,)
    slopes); 0.0 without reading memory when ``has_alibi == 0``."""
    return tl.load(ALIBI + off_z.to(tl.int64) * stride_az + off_h * stride_ah,
                   mask=has_alibi != 0, other=0.0).to(tl.float32)


@triton.jit
def alibi_scores(scores, slope, q_pos, k_pos, shift):
    """``scores - slope * |q_pos + shift - k_pos|`` with ``shift = seqlen_k -
    seqlen_q`` of the sequence (flash-attn's ALiBi bias; ``slope`` in the
    units of ``scores``)."""
    return scores - slope * tl.abs(q_pos + shift - k_pos).to(tl.float32)
