"""FlashAttention forward and backward on (B, H, S, D) tensors, through our kernels.

This is the one implementation every route into torch ends in. It checks that
the request is covered (returning the reason when it is not, so the caller can
fall back to torch's own kernel), prepares tensors so they meet the
specialization assumptions the kernels were compiled with, allocates outputs,
and hands each kernel launch to the backend of the tensors' device: the AOT
archive on a GPU, Triton's interpreter on the CPU.
"""

from __future__ import annotations

import math

import torch

from .backends import Backend, backend_for

# Head dims the kernels cover: multiples of 8 up to this (padded to a power
# of two >= 16 inside the kernels, never in memory).
MAX_HEAD_DIM = 256
# torch's CUDA flash op (and flash-attn) align a causal mask to the bottom
# right when seqlen_q != seqlen_k; torch's math backend and CPU flash op to the
# top left. Both agree when seqlen_q == seqlen_k.
CAUSAL_ALIGNMENTS = ("bottom_right", "top_left")

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
# y and z grid dimensions are limited to 65535 on both CUDA and HIP.
MAX_GRID_Y = 65535
INT32_MAX = 2**31 - 1
# The largest BLOCK_M / BLOCK_N any config uses.
MAX_BLOCK = 256


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                       dropout_p: float = 0.0, is_causal: bool = False,
                       attn_mask=None, return_debug_mask: bool = False) -> str | None:
    """Why our kernels cannot compute this attention, or None if they can."""
    if attn_mask is not None:
        return "an attn_mask is not supported yet"
    if dropout_p != 0.0:
        return "dropout is not supported yet"
    if return_debug_mask:
        return "return_debug_mask is not supported yet"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "query/key/value must be 4-D (batch, heads, seqlen, head_dim)"
    dtype = q.dtype
    if k.dtype != dtype or v.dtype != dtype:
        return "query, key and value must share a dtype"
    if dtype not in DTYPE_NAMES:
        return f"dtype {dtype} is not covered (fp16 and bf16 are)"
    if k.device != q.device or v.device != q.device:
        return "query, key and value must be on one device"
    b, h, sq, d = q.shape
    kb, kh, sk, kd = k.shape
    if k.shape != v.shape or kb != b or kd != d:
        return "key/value shapes must match query in batch and head_dim"
    if kh == 0 or h % kh:
        return (f"query heads ({h}) must be a multiple of key/value heads ({kh}) "
                "(GQA/MQA)")
    if d % 8 or not 8 <= d <= MAX_HEAD_DIM:
        return f"head_dim {d} is not covered (multiples of 8 from 8 to {MAX_HEAD_DIM} are)"
    if b * h == 0 or sq == 0 or sk == 0:
        return "empty inputs"
    if b * h > MAX_GRID_Y:
        return f"batch*heads = {b * h} exceeds the grid limit {MAX_GRID_Y}"
    for t in (q, k, v):
        # Strides are 32-bit kernel arguments; offsets inside one block of up
        # to MAX_BLOCK rows are 32-bit too (the kernels offset blocks in 64-bit).
        if max(t.stride()) > INT32_MAX or t.stride(2) * MAX_BLOCK > INT32_MAX:
            return "strides too large for the kernels' 32-bit stride arguments"
    backend = backend_for(q)
    if backend is None:
        return f"no backend for device {q.device}"
    return backend.unsupported_reason("attn_fwd", dtype=DTYPE_NAMES[dtype], head_dim=d,
                                      work=b * h * sq * sk * d)


def _meets_assumptions(t: torch.Tensor) -> bool:
    """Unit last-dim stride, 16-byte-aligned base, other strides divisible by 16 (4-D t)."""
    s0, s1, s2, s3 = t.stride()
    return s3 == 1 and not (t.data_ptr() | s0 | s1 | s2) & 15


def _prepared(t: torch.Tensor) -> torch.Tensor:
    """t itself if the kernels can read it in place, else a dense copy.

    Kernels are compiled assuming unit last-dim stride, 16-byte-aligned base
    addresses and strides divisible by 16 (elements); a contiguous copy meets
    them when the head dim is a multiple of 16, else :func:`_fresh` lays the
    rows out 16 elements apart.
    """
    if _meets_assumptions(t):
        return t
    dense = t.contiguous()
    # contiguous() keeps odd strides of size-1 dims; a fresh tensor has none.
    return dense if _meets_assumptions(dense) else _fresh(t).copy_(t)


def _fresh(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor shaped like t that meets the kernels' assumptions:
    its rows are padded to a multiple of 16 elements (our own allocation; the
    kernels never touch the padding)."""
    d = t.shape[-1]
    padded = -(-d // 16) * 16
    if padded == d:
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)
    return torch.empty((*t.shape[:-1], padded), dtype=t.dtype, device=t.device)[..., :d]


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    s = t.stride()
    return s[0], s[1], s[2]


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def causal_shift(is_causal: bool, seqlen_q: int, seqlen_k: int,
                 causal_alignment: str = "bottom_right") -> int:
    """The mask diagonal: with ``is_causal`` key j is visible from query i iff j <= i + shift."""
    if causal_alignment == "bottom_right":
        return seqlen_k - seqlen_q
    if causal_alignment == "top_left":
        return 0
    raise ValueError(f"causal_alignment must be one of {CAUSAL_ALIGNMENTS}, got {causal_alignment!r}")


def mask_args(is_causal: bool, seqlen_q: int, seqlen_k: int,
              causal_alignment: str = "bottom_right",
              window_size: tuple[int, int] = (-1, -1)) -> tuple[int, int, int]:
    """The kernels' ``(causal_shift, window_left, window_right)``.

    Key j is visible from query i iff ``i + shift - left <= j <= i + shift +
    right``, a negative size leaving that side unbounded (flash-attn's
    ``window_size``; causal is ``right = 0``). Sizes are clamped to
    ``seqlen_q + seqlen_k`` (the same mask) so that no bound overflows int32.
    """
    shift = causal_shift(is_causal, seqlen_q, seqlen_k, causal_alignment)
    left, right = (int(w) for w in window_size)
    if is_causal:
        right = 0
    cap = seqlen_q + seqlen_k
    left = -1 if left < 0 else min(left, cap)
    right = -1 if right < 0 else min(right, cap)
    return shift, left, right


def flash_attn_window(window_size_left, window_size_right, seqlen_k: int) -> tuple[int, int]:
    """flash-attn's normalisation of a window (its ``mha_fwd``): None or -1 is
    unbounded, and so is a size >= seqlen_k (this differs from the plain rule
    only for rows a bound would push past every key, e.g. seqlen_q > 2 *
    seqlen_k)."""
    left = -1 if window_size_left is None else int(window_size_left)
    right = -1 if window_size_right is None else int(window_size_right)
    return (-1 if left >= seqlen_k else left), (-1 if right >= seqlen_k else right)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
            scale: float | None = None, out: torch.Tensor | None = None,
            causal_alignment: str = "bottom_right",
            window_size: tuple[int, int] = (-1, -1)) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output (like ``out`` or ``empty_like(q)``) and the fp32 logsumexp (B, H, Sq).

    k and v may have fewer heads than q (GQA/MQA: query head h reads key/value
    head h // (Hq // Hkv)). With ``is_causal`` and seqlen_q != seqlen_k the mask
    is aligned as ``causal_alignment`` says; query rows that see no key
    (bottom-right, seqlen_q > seqlen_k) get output 0 and logsumexp +inf.
    ``window_size = (left, right)`` restricts row i to keys
    ``i + shift - left .. i + shift + right`` (see :func:`mask_args`; -1:
    unbounded); rows whose window holds no key get output 0 too.
    The caller has checked :func:`unsupported_reason`.
    """
    backend: Backend = backend_for(q)
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    shift, left, right = mask_args(is_causal, sq, sk, causal_alignment, window_size)
    sm_scale = default_scale(d) if scale is None else float(scale)
    qp, kp, vp = _prepared(q), _prepared(k), _prepared(v)
    if out is None:
        out = torch.empty_like(q)
    o = out if _meets_assumptions(out) else _fresh(q)
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
    kernel = backend.kernel("attn_fwd", dtype=DTYPE_NAMES[q.dtype], head_dim=d,
                            seqlen_q=sq, seqlen_k=sk)
    grid = (_cdiv(sq, kernel.config["BLOCK_M"]), b * h, 1)
    kernel.launch(grid, q.device, (
        qp, kp, vp, o, lse,
        *_strides(qp), *_strides(kp), *_strides(vp), *_strides(o),
        h, h // hk, sq, sk, d, shift, left, right, sm_scale))
    if o is not out:
        out.copy_(o)
    return out, lse


def backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, *, is_causal: bool = False,
             scale: float | None = None,
             grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
             causal_alignment: str = "bottom_right",
             window_size: tuple[int, int] = (-1, -1)
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (written into ``grads`` if given, else like q, k, v).

    Deterministic: with GQA each dK/dV block is summed over its query heads by
    one program, without atomics.
    """
    backend: Backend = backend_for(q)
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    shift, left, right = mask_args(is_causal, sq, sk, causal_alignment, window_size)
    sm_scale = default_scale(d) if scale is None else float(scale)
    dtype = DTYPE_NAMES[q.dtype]
    qp, kp, vp, op, dop = (_prepared(t) for t in (q, k, v, out, grad_out))
    lse = lse.contiguous()
    delta = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
    if grads is None:
        grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    dq, dk, dv = (g if _meets_assumptions(g) else _fresh(g) for g in grads)

    pre = backend.kernel("attn_bwd_preprocess", dtype=dtype, head_dim=d,
                         seqlen_q=sq, seqlen_k=sk)
    pre.launch((_cdiv(sq, pre.config["BLOCK_M"]), b * h, 1), q.device, (
        op, dop, delta, *_strides(op), *_strides(dop), h, sq, d))

    common = (qp, kp, vp, dop, lse, delta)
    common_strides = (*_strides(qp), *_strides(kp), *_strides(vp), *_strides(dop))
    tail = (h, h // hk, sq, sk, d, shift, left, right, sm_scale)
    dkdv = backend.kernel("attn_bwd_dkdv", dtype=dtype, head_dim=d, seqlen_q=sq, seqlen_k=sk)
    dkdv.launch((_cdiv(sk, dkdv.config["BLOCK_N"]), b * hk, 1), q.device, (
        *common, dk, dv, *common_strides, *_strides(dk), *_strides(dv), *tail))
    dqk = backend.kernel("attn_bwd_dq", dtype=dtype, head_dim=d, seqlen_q=sq, seqlen_k=sk)
    dqk.launch((_cdiv(sq, dqk.config["BLOCK_M"]), b * h, 1), q.device, (
        *common, dq, *common_strides, *_strides(dq), *tail))

    for written, wanted in zip((dq, dk, dv), grads):
        if written is not wanted:
            wanted.copy_(written)
    return grads
