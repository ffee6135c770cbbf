"""Route (c): a TorchFunctionMode that computes ``F.scaled_dot_product_attention``
on our kernels where torch's own selector never would pick flash (e.g.
gfx908, for which torch's bundled AOTriton has no image).

    with aotriton_rocm.AttentionMode():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)

Inside the mode every SDPA call our kernels cover (no attn_mask, dropout 0,
fp16/bf16, 4-D tensors, a covered head dim, GQA through ``enable_gqa=True``)
runs forward and backward through :class:`~aotriton_rocm.flash_attn_interface.AttentionFunction`;
everything else, and every other function, goes to torch untouched. ``is_causal``
is aligned top-left, as SDPA defines it. Why the last calls passed through is
counted in :attr:`AttentionMode.passed_through` (reason -> calls).
"""

from __future__ import annotations

import collections

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from . import attention
from .flash_attn_interface import AttentionFunction


def _sdpa_args(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    return query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa


def sdpa_unsupported_reason(query, key, value, attn_mask, dropout_p, is_causal, scale,
                            enable_gqa) -> str | None:
    """Why our kernels don't compute this SDPA call, or None."""
    tensors = (query, key, value)
    if any(not isinstance(t, torch.Tensor) for t in tensors):
        return "query/key/value must be tensors"
    if any(type(t) is not torch.Tensor or t.is_nested for t in tensors):
        return "tensor subclasses and nested tensors are not covered"
    if attn_mask is not None:
        return "an attn_mask is not supported yet"
    if dropout_p:
        return "dropout is not supported yet"
    if dropout_p:
        return "dropout is not supported yet"
    if query.dim() == 4 and key.dim() == 4 and key.size(1) != query.size(1) and not enable_gqa:
        return "query and key/value heads differ without enable_gqa=True (torch decides)"
    return attention.unsupported_reason(query, key, value, dropout_p=dropout_p,
                                        is_causal=is_causal)


class AttentionMode(TorchFunctionMode):
    """Context manager: covered ``F.scaled_dot_product_attention`` calls run on
    our kernels (differentiable), the rest passes through to torch."""

    def __init__(self):
        super().__init__()
        self.passed_through: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            try:
                call = _sdpa_args(*args, **kwargs)
            except TypeError:
                call = None  # torch raises the right error below
            reason = "unexpected arguments" if call is None else sdpa_unsupported_reason(*call)
            if reason is None:
                query, key, value, _, _, is_causal, scale, _ = call
                out, _, _ = AttentionFunction.apply(query, key, value, None, scale,
                                                    bool(is_causal), "top_left", (-1, -1))
                return out
            self.passed_through[reason] += 1
        return func(*args, **kwargs)
