"""Route (c): a TorchFunctionMode that computes ``F.scaled_dot_product_attention``
on our kernels where torch's own selector never would pick flash (e.g.
gfx908, for which torch's bundled AOTriton has no image, or any call with an
``attn_mask``).

    with aotriton_rocm.AttentionMode():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1)

Inside the mode every SDPA call our kernels cover runs forward and backward
through :class:`~aotriton_rocm.flash_attn_interface.AttentionFunction`:
4-D (B, H, S, D) fp16/bf16/fp32 tensors with a covered head dim, GQA through
``enable_gqa=True``, ``is_causal`` (aligned top-left, as SDPA defines it),
``scale``, ``dropout_p`` (our Philox stream, drawn from torch's generator on
the query's device), an ``attn_mask`` (boolean, True = attend, or additive of
the query's dtype, broadcast to (B, H, Sq, Sk); the gradient of a float mask
that requires grad), and torch's ``causal_upper_left`` / ``causal_lower_right``
bias objects (top-left / bottom-right causal). Query rows whose mask hides
every key give 0, as torch's math backend does. Everything else, and every
other function, goes to torch untouched; why the calls passed through is
counted in :attr:`AttentionMode.passed_through` (reason -> calls).
"""

from __future__ import annotations

import collections
import numbers
import sys

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..core.attention import unsupported_reason
from ..flash_attn_interface import AttentionFunction

_BIAS_MODULE = "torch.nn.attention.bias"


def _causal_bias_types(attn_mask):
    """(CausalBias, CausalVariant) when ``attn_mask`` is one, else None.
    torch's bias module imports torch._dynamo (seconds), so it is never
    imported here: a process that has not imported it holds no CausalBias."""
    bias_module = sys.modules.get(_BIAS_MODULE)
    causal_bias = getattr(bias_module, "CausalBias", None)  # a prototype API: it may move
    if causal_bias is None or not isinstance(attn_mask, causal_bias):
        return None
    return causal_bias, bias_module.CausalVariant

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _sdpa_args(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    return query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa


def _plan(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """(reason, None) when our kernels don't compute this SDPA call, else
    (None, (bias, is_causal, causal_alignment, dropout_p, scale))."""
    tensors = (query, key, value)
    if any(not isinstance(t, torch.Tensor) for t in tensors):
        return "query/key/value must be tensors", None
    if any(type(t) not in _PLAIN or t.is_nested for t in tensors):
        return "tensor subclasses and nested tensors are not covered", None
    if not isinstance(dropout_p, numbers.Real) or isinstance(dropout_p, bool):
        return "dropout_p must be a Python number", None
    if scale is not None and not isinstance(scale, numbers.Real):
        return "scale must be None or a Python number", None
    if query.dim() == 4 and key.dim() == 4 and key.size(1) != query.size(1) and not enable_gqa:
        return "query and key/value heads differ without enable_gqa=True (torch decides)", None
    alignment = "top_left"
    bias = attn_mask
    causal_bias = _causal_bias_types(attn_mask)
    if causal_bias is not None:
        CausalVariant = causal_bias[1]  # noqa: N806
        if is_causal:
            return "a CausalBias attn_mask with is_causal=True (torch refuses it)", None
        if query.dim() != 4 or key.dim() != 4 or (attn_mask.seq_len_q, attn_mask.seq_len_kv) \
                != (query.size(-2), key.size(-2)):
            return ("a CausalBias whose (seq_len_q, seq_len_kv) differ from the query/key "
                    "lengths (torch decides)"), None
        bias, is_causal = None, True
        if attn_mask.variant == CausalVariant.LOWER_RIGHT:
            alignment = "bottom_right"
        elif attn_mask.variant != CausalVariant.UPPER_LEFT:
            return f"CausalBias variant {attn_mask.variant!r} is not covered", None
    elif attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            return "attn_mask must be a tensor", None
        if type(attn_mask) not in _PLAIN or attn_mask.is_nested:
            return "attn_mask tensor subclasses and nested tensors are not covered", None
        if is_causal:
            return ("an attn_mask together with is_causal=True (torch's math backend refuses "
                    "it, its CPU flash kernel combines them: torch decides)"), None
        if attn_mask.dim() > 4:
            return "an attn_mask of more than 4 dims is not covered", None
        if attn_mask.dtype not in (torch.bool, query.dtype):
            return (f"attn_mask dtype {attn_mask.dtype} is neither bool nor the query's "
                    f"({query.dtype}) (torch decides)"), None
    reason = unsupported_reason(query, key, value, dropout_p=float(dropout_p),
                                          is_causal=bool(is_causal), attn_mask=bias)
    if reason:
        return reason, None
    return None, (bias, bool(is_causal), alignment, float(dropout_p), scale)


def sdpa_unsupported_reason(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                            scale=None, enable_gqa=False) -> str | None:
    """Why our kernels don't compute this SDPA call, or None."""
    return _plan(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)[0]


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
            if call is None:
                reason, plan = "unexpected arguments", None
            else:
                reason, plan = _plan(*call)
            if reason is None:
                query, key, value = call[:3]
                bias, is_causal, alignment, dropout_p, scale = plan
                out, _, _ = AttentionFunction.apply(query, key, value, bias, scale, is_causal,
                                                    alignment, (-1, -1), dropout_p)
                return out
            self.passed_through[reason] += 1
        return func(*args, **kwargs)
