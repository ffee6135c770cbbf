"""Direct API for code that does not go through SDPA: flash-attn's
``flash_attn_func`` on our kernels.

``flash_attn_func(q, k, v, ...)`` takes flash-attn's (batch, seqlen, heads,
head_dim) layout, GQA/MQA (key/value heads dividing the query heads), a
softmax scale, causal (bottom-right aligned when seqlen_q != seqlen_k, as
flash-attn) and a sliding window, and is differentiable. CUDA/ROCm tensors run
the precompiled kernels; CPU tensors run the same kernel sources in Triton's
interpreter (slow: for testing). Dropout and ``return_attn_probs`` are not
supported yet and raise :class:`NotImplementedError`; anything else our
kernels don't cover (dtype, head dim) raises :class:`ValueError` naming the
reason. There is no fallback here: this API is ours alone.

:class:`AttentionFunction` (on (batch, heads, seqlen, head_dim) tensors) is
the autograd function behind it, shared with :class:`aotriton_rocm.AttentionMode`.
"""

from __future__ import annotations

import torch

from . import attention

SUPPORTED = ("fp16/bf16 (B, S, H, D) tensors, head dims that are multiples of 8 up to "
             f"{attention.MAX_HEAD_DIM}, GQA/MQA, softmax_scale, causal, window_size, "
             "dropout_p=0.0, return_attn_probs=False")


class AttentionFunction(torch.autograd.Function):
    """Attention on (B, H, S, D) tensors (k, v may have fewer heads: GQA),
    forward and backward through :mod:`aotriton_rocm.attention`. The caller
    has checked :func:`attention.unsupported_reason`."""

    @staticmethod
    def forward(ctx, q, k, v, scale, is_causal, causal_alignment, window_size):
        out, lse = attention.forward(q, k, v, is_causal=is_causal, scale=scale,
                                     causal_alignment=causal_alignment, window_size=window_size)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask = (scale, is_causal, causal_alignment, window_size)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        scale, is_causal, causal_alignment, window_size = ctx.mask
        dq, dk, dv = attention.backward(grad_out, q, k, v, out, lse, is_causal=is_causal,
                                        scale=scale, causal_alignment=causal_alignment,
                                        window_size=window_size)
        return dq, dk, dv, None, None, None, None


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: float | None = None, causal: bool = False,
                    window_size: tuple[int, int] = (-1, -1), deterministic: bool = True,
                    return_attn_probs: bool = False) -> torch.Tensor:
    """flash-attn's ``flash_attn_func`` on our kernels.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k,
    headdim) with nheads_k dividing nheads. Key j is visible from query i iff
    ``i + seqlen_k - seqlen_q - window_size[0] <= j <= i + seqlen_k - seqlen_q
    + window_size[1]`` (-1: unbounded; causal sets ``window_size[1] = 0``);
    rows that see no key give 0. Returns the output, (batch, seqlen_q, nheads,
    headdim). The backward pass is always deterministic (``deterministic`` is
    accepted for compatibility).
    """
    if dropout_p:
        raise NotImplementedError(
            f"aotriton_rocm.flash_attn_func: dropout_p={dropout_p} is not supported yet "
            f"(supported: {SUPPORTED})")
    if return_attn_probs:
        raise NotImplementedError(
            "aotriton_rocm.flash_attn_func: return_attn_probs=True is not supported yet "
            f"(supported: {SUPPORTED})")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("aotriton_rocm.flash_attn_func: q, k, v must be 4-D "
                         "(batch, seqlen, heads, head_dim)")
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    reason = attention.unsupported_reason(qt, kt, vt)
    if reason:
        raise ValueError(f"aotriton_rocm.flash_attn_func: {reason} (supported: {SUPPORTED})")
    window = attention.flash_attn_window(*window_size, k.size(1))
    out = AttentionFunction.apply(qt, kt, vt, softmax_scale, bool(causal), "bottom_right", window)
    return out.transpose(1, 2)
