"""Direct API for code that does not go through SDPA: flash-attn 2.8's
``flash_attn_func``, ``flash_attn_varlen_func`` and their packed variants
(``flash_attn_qkvpacked_func``, ``flash_attn_kvpacked_func``,
``flash_attn_varlen_qkvpacked_func``, ``flash_attn_varlen_kvpacked_func``) on
our kernels, with flash-attn's signatures and positional order.

``flash_attn_func(q, k, v, ...)`` takes flash-attn's (batch, seqlen, heads,
head_dim) layout; ``flash_attn_varlen_func`` packed (total, heads, head_dim)
batches whose sequences start at ``cu_seqlens``. Both cover fp16/bf16/fp32,
GQA/MQA (key/value heads dividing the query heads), a softmax scale, causal
(bottom-right aligned when seqlen_q != seqlen_k, as flash-attn; per sequence
for packed batches), a sliding window, softcap, ALiBi and dropout, and are
differentiable.
CUDA/ROCm tensors run the precompiled kernels; CPU tensors run the same kernel
sources in Triton's interpreter (slow: for testing). Anything our kernels
don't cover raises :class:`ValueError` naming the reason and what is
supported. There is no fallback here: this API is ours alone.

Both run as torch operators (:mod:`aotriton_rocm.flash_attn_ops`), so that
``torch.compile`` sees one node per call and CUDA graphs record it.
:class:`AttentionFunction` (on (batch, heads, seqlen, head_dim) tensors, or
packed ones with a :class:`~aotriton_rocm.attention.Varlen`) is the autograd
function of :class:`aotriton_rocm.AttentionMode`.
"""

from __future__ import annotations

import operator

import torch

from .core.attention import (Varlen, default_scale, mask_args, new_bias_grad,
                             problem_dims)
from .core.attention import backward as attention_backward, forward as attention_forward
from .core.dropout_masks import flash_attn_s_dmask
from .integrations.flash_attn_ops import (check_operands, fail as _fail, forward as flash_attn_forward,
                                          forward_state, schema_refused)
# flash-attn's module also holds the KV-cache entry point.
from .integrations.kvcache_api import flash_attn_with_kvcache, varlen_paged_forward

__all__ = ["AttentionFunction", "flash_attn_func", "flash_attn_kvpacked_func",
           "flash_attn_qkvpacked_func", "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func",
           "flash_attn_with_kvcache"]

PAGED_NO_BACKWARD = (
    "aotriton_rocm.flash_attn_varlen_func: there is no backward through block_table (a paged "
    "KV cache): its kernels compute the forward only, as flash-attn's do. To train, pass k "
    "and v packed (total_k, nheads_k, headdim) without block_table; for inference, run the "
    "forward under torch.no_grad() or with q, k and v detached")


class ForwardOnly(torch.autograd.Function):
    """Outputs of a route without a backward, attached to the inputs' graph:
    ``apply(message, run, *inputs)`` returns ``run()``'s (out, lse), and a
    backward through ``out`` raises NotImplementedError(message) rather than
    leaving the inputs silently without gradient (flash-attn's paged varlen
    forward runs with inputs that require grad; its backward is refused)."""

    @staticmethod
    def forward(ctx, message, run, *inputs):
        ctx.message = message
        out, lse = run()
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(ctx.message)


class AttentionFunction(torch.autograd.Function):
    """Attention on (B, H, S, D) tensors (k, v may have fewer heads: GQA), or
    on packed (total, H, D) ones with ``varlen``, forward and backward through
    :mod:`aotriton_rocm.attention`.

    ``apply(q, k, v, bias, scale, is_causal, causal_alignment, window_size,
    dropout_p=0.0, varlen=None, return_debug_mask=False, softcap=0.0,
    alibi_slopes=None)`` returns ``(out, lse, debug_mask)``; only ``out`` is
    differentiable (the ALiBi slopes get no gradient, as in flash-attn). ``bias`` (None, an
    additive mask of q's dtype or a boolean mask, True = attend) broadcasts
    to (B, H, Sq, Sk); a float bias that requires grad gets its gradient,
    summed to its own shape. With dropout the forward takes the Philox state
    from torch's generator (:func:`attention.new_rng_state`, advanced by
    B * H * Sq * Sk) and the backward regenerates the same mask from it. ``debug_mask`` is None unless asked
    for: then a zero-initialised (B, H, Sq, Sk) tensor (max seqlens with
    ``varlen``, sequence b at the top left of [b]) of q's dtype where the
    kernel stored each visited score's unnormalised probability
    (``exp(score - running row max)``), negated where dropout dropped it;
    entries of key blocks a row never visits (outside its causal/window
    range) stay 0. The caller has checked :func:`attention.unsupported_reason`.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, scale, is_causal, causal_alignment, window_size,
                dropout_p=0.0, varlen=None, return_debug_mask=False, softcap=0.0,
                alibi_slopes=None, deterministic=False):
        state, debug = forward_state(q, k, varlen, dropout_p, return_debug_mask)
        rng = None if state is None else (state[0], state[1])
        out, lse = attention_forward(q, k, v, is_causal=is_causal, scale=scale,
                                     causal_alignment=causal_alignment, window_size=window_size,
                                     bias=bias, dropout_p=dropout_p, rng=rng, debug_mask=debug,
                                     varlen=varlen, softcap=softcap, alibi_slopes=alibi_slopes)
        ctx.save_for_backward(q, k, v, out, lse, bias, state if dropout_p else None,
                              alibi_slopes)
        ctx.options = (scale, is_causal, causal_alignment, window_size, dropout_p, varlen,
                       softcap, deterministic)
        ctx.mark_non_differentiable(*(t for t in (lse, debug) if t is not None))
        return out, lse, debug

    @staticmethod
    def backward(ctx, grad_out, _grad_lse=None, _grad_debug=None):
        q, k, v, out, lse, bias, state, alibi_slopes = ctx.saved_tensors
        (scale, is_causal, causal_alignment, window_size, dropout_p, varlen, softcap,
         deterministic) = ctx.options
        want_bias_grad = (bias is not None and bias.dtype != torch.bool
                          and ctx.needs_input_grad[3])
        bias_grad = None
        if want_bias_grad:
            b, h, sq, _ = q.shape
            bias_grad = new_bias_grad((b, h, sq, k.shape[2]), q.dtype, q.device)
        dq, dk, dv = attention_backward(
            grad_out, q, k, v, out, lse, is_causal=is_causal, scale=scale,
            causal_alignment=causal_alignment, window_size=window_size, bias=bias,
            bias_grad=bias_grad, dropout_p=dropout_p,
            rng=None if state is None else (state[0], state[1]), varlen=varlen,
            softcap=softcap, alibi_slopes=alibi_slopes, deterministic=deterministic)
        # The kernels write the (B, H, Sq, Sk) gradient; a broadcast bias gets its sum.
        dbias = None if bias_grad is None else bias_grad.sum_to_size(bias.shape)
        return dq, dk, dv, dbias, None, None, None, None, None, None, None, None, None, None


def _check_common(api, q, k, v, dropout_p, window_size, softcap):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            _fail(api, f"{name} must be a tensor, got {type(t).__name__}")
    try:
        softcap = float(softcap)
    except (TypeError, ValueError):
        _fail(api, f"softcap must be a float (0: off), got {softcap!r}")
    try:
        # operator.index: 1.5 is an error, not a silently truncated 1
        left, right = (operator.index(w) for w in window_size)
    except (TypeError, ValueError):
        _fail(api, f"window_size must be a pair of ints (-1: unbounded), got {window_size!r}")
    try:
        dropout_p = float(dropout_p)
    except (TypeError, ValueError):
        _fail(api, f"dropout_p must be a float, got {dropout_p!r}")
    return dropout_p, (left, right), softcap


def _plain_operands(q, k, v, window_size, alibi_slopes) -> bool:
    """Tensors of flash_attn_func's rank, on one device, and a pair of window
    sides: the call may go to the operator at once (a few microseconds of
    host time saved)."""
    Tensor = torch.Tensor
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
            and isinstance(window_size, (tuple, list)) and len(window_size) == 2):
        return False
    device = q.device
    return (q.dim() == 4 and k.dim() == 4 and v.dim() == 4 and k.device == device
            and v.device == device and (alibi_slopes is None or (
                isinstance(alibi_slopes, Tensor) and alibi_slopes.device == device)))


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: float | None = None, causal: bool = False,
                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: torch.Tensor | None = None, deterministic: bool = False,
                    return_attn_probs: bool = False):
    """flash-attn's ``flash_attn_func`` on our kernels.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k,
    headdim) with nheads_k dividing nheads. Key j is visible from query i iff
    ``i + seqlen_k - seqlen_q - window_size[0] <= j <= i + seqlen_k - seqlen_q
    + window_size[1]`` (-1: unbounded; causal sets ``window_size[1] = 0``);
    rows that see no key give 0 (and logsumexp +inf). ``softcap > 0``
    replaces each scaled score s by ``softcap * tanh(s / softcap)`` (Gemma-2
    style); ``alibi_slopes`` (float32, (nheads,) or (batch, nheads)) then adds
    ``-slope * |i + seqlen_k - seqlen_q - j|`` to the score of query i and key
    j (also with causal: the logsumexp is that of the biased scores; the
    slopes get no gradient). ``dropout_p`` drops
    attention probabilities (kept ones scaled by ``1 / (1 - dropout_p)``)
    with a Philox stream seeded from torch's generator on q's device
    (``torch.manual_seed`` reproduces it); the backward drops the same ones.
    ``deterministic=True`` makes the backward bitwise reproducible, as
    flash-attn's: by default, where the GPU's image has the fused backward
    (sm_90, head dims 64 and 128, both sequences long enough), dQ is summed with
    atomics in an order that varies from run to run; torch's
    ``use_deterministic_algorithms(True)`` has the same effect.

    Returns the output, (batch, seqlen_q, nheads, headdim), or with
    ``return_attn_probs=True`` ``(out, softmax_lse, S_dmask)`` as flash-attn
    2.8 does: ``softmax_lse`` is the fp32 (batch, nheads, seqlen_q) logsumexp
    of the scaled scores; ``S_dmask`` is an empty (0,) tensor when
    ``dropout_p == 0``, else flash-attn's debug mask: (batch, nheads,
    round_up(seqlen_q, 128), round_up(seqlen_k, 128)) of q's dtype, entry (i,
    j) holding ``exp(score - m)`` with ``m`` the maximum of row i's scores
    over the key columns >= (j // N) * N (N per head dim:
    :func:`aotriton_rocm.dropout_masks.s_dmask_block_n`, flash-attn's
    ``_get_block_size_n`` with dropout), negated where dropout dropped it;
    padding rows/columns and keys a row does not see hold 0. flash-attn's
    test helpers (``normalize_flash_attn_S``) turn it into the probabilities;
    ``S_dmask >= 0`` is the keep mask on the visible entries (see
    :mod:`aotriton_rocm.dropout_masks`). For testing, as in flash-attn: it
    costs batch * nheads * seqlen_q * seqlen_k elements.
    """
    if not return_attn_probs and _plain_operands(q, k, v, window_size, alibi_slopes):
        try:
            return flash_attn_forward(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal,
                                      *window_size, softcap, alibi_slopes, False, deterministic)[0]
        except (TypeError, RuntimeError) as exc:
            if not schema_refused(exc):  # else the conversions and checks below
                raise
    api = "flash_attn_func"
    dropout_p, window, softcap = _check_common(api, q, k, v, dropout_p, window_size, softcap)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        _fail(api, "q, k, v must be 4-D (batch, seqlen, heads, head_dim); packed batches go "
                   "to flash_attn_varlen_func")
    check_operands(api, q, k=k, v=v, alibi_slopes=alibi_slopes)
    debug = bool(return_attn_probs) and dropout_p > 0
    out, lse, _, dmask = flash_attn_forward(q, k, v, None, None, 0, 0, dropout_p, softmax_scale,
                                            bool(causal), *window, softcap, alibi_slopes, debug,
                                            bool(deterministic))
    if not return_attn_probs:
        return out
    return out, lse, _s_dmask(dmask if debug else None, q.transpose(1, 2), k.transpose(1, 2),
                              softmax_scale, bool(causal), window, None, softcap, alibi_slopes)


def _score_mod(softcap: float, alibi_slopes):
    """The kernels' score modifiers on (B, H, Sq, Sk) fp32 scaled scores, for
    the host-composed S_dmask (None without any)."""
    if not softcap and alibi_slopes is None:
        return None

    def modify(scores, rows, cols, seqlen_q, seqlen_k):
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        if alibi_slopes is not None:
            slopes = alibi_slopes.float()
            slopes = slopes if slopes.dim() == 2 else slopes[None, :]
            shift = (seqlen_k - seqlen_q).to(scores.device)[:, None, None, None]
            distance = (rows[None, None, :, None] + shift - cols[None, None, None, :]).abs()
            scores = scores - slopes[:, :, None, None] * distance
        return scores

    return modify


def _s_dmask(kernel_mask, q, k, softmax_scale, causal, window, varlen, softcap=0.0,
             alibi_slopes=None):
    """flash-attn's S_dmask from the kernel's debug mask (see
    :mod:`aotriton_rocm.dropout_masks`); without dropout flash-attn returns
    an empty (0,) tensor of q's dtype."""
    if kernel_mask is None:
        return torch.empty((0,), dtype=q.dtype, device=q.device)
    _, _, _, sq, sk, d = problem_dims(q, k, varlen)
    scale = default_scale(d) if softmax_scale is None else float(softmax_scale)
    mask = mask_args(causal, sq, sk, "bottom_right", window)
    with torch.no_grad():
        return flash_attn_s_dmask(kernel_mask, q.detach(), k.detach(),
                                                scale=scale, mask=mask, varlen=varlen,
                                                score_mod=_score_mod(softcap, alibi_slopes))


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: float | None = None, causal: bool = False,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: torch.Tensor | None = None,
                           deterministic: bool = False, return_attn_probs: bool = False,
                           block_table: torch.Tensor | None = None):
    """flash-attn's ``flash_attn_varlen_func`` on our kernels.

    q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim): packed
    batches, sequence b holding rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``
    of q (and likewise of k, v); ``cu_seqlens_q/k`` are int32 (batch + 1)
    offsets starting at 0 and ``max_seqlen_q/k`` bound the sequence lengths.
    Masks (causal: bottom-right aligned, window_size, as in
    :func:`flash_attn_func`) and ALiBi (``alibi_slopes`` (nheads,) or
    (batch, nheads), ``i`` and ``j`` counted within the sequence) apply per
    sequence; ``softcap`` as in :func:`flash_attn_func`. Packed rows past the last
    offset are not attention rows: their output (and gradient) is 0.
    Differentiable, dropout included.

    With ``return_attn_probs=True`` returns ``(out, softmax_lse, S_dmask)``:
    ``softmax_lse`` is the fp32 (nheads, total_q) logsumexp (flash-attn's
    packed layout); ``S_dmask`` as in :func:`flash_attn_func`, (batch,
    nheads, round_up(max_seqlen_q, 128), round_up(max_seqlen_k, 128)) with
    sequence b's rows and columns at the top left of ``S_dmask[b]`` (an
    empty (0,) tensor without dropout).

    With ``block_table`` (int32 (batch, max_num_blocks)) k and v are paged
    caches, (num_blocks, page_block_size, nheads_k, headdim) with
    page_block_size a multiple of 16: sequence b's keys are the first
    ``cu_seqlens_k[b + 1] - cu_seqlens_k[b]`` positions of its pages (fp16/bf16,
    headdim <= 256, no dropout: the KV-cache kernels of
    :func:`aotriton_rocm.flash_attn_with_kvcache`). Inputs that require grad
    are fine; a backward through this output raises NotImplementedError, as
    flash-attn has no backward for a paged KV cache either.
    """
    api = "flash_attn_varlen_func"
    dropout_p, window, softcap = _check_common(api, q, k, v, dropout_p, window_size, softcap)
    if block_table is not None:
        if dropout_p:
            _fail(api, "dropout with block_table (a paged KV cache) is not covered")
        def run():
            return varlen_paged_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                        max_seqlen_k, block_table, softmax_scale, bool(causal),
                                        window, softcap=softcap, alibi_slopes=alibi_slopes)

        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            out, lse = ForwardOnly.apply(PAGED_NO_BACKWARD, run, q, k, v)
        else:
            out, lse = run()
        if not return_attn_probs:
            return out
        return out, lse, torch.empty(0, dtype=q.dtype, device=q.device)
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        _fail(api, "q, k, v must be 3-D packed (total, heads, head_dim); (batch, seqlen, heads, "
                   "head_dim) tensors go to flash_attn_func")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            _fail(api, f"{name} must be an int32 tensor, got {type(cu).__name__}")
    try:
        max_q, max_k = int(max_seqlen_q), int(max_seqlen_k)
    except (TypeError, ValueError):
        _fail(api, "max_seqlen_q and max_seqlen_k must be ints")
    check_operands(api, q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                    alibi_slopes=alibi_slopes)
    debug = bool(return_attn_probs) and dropout_p > 0
    out, lse, _, dmask = flash_attn_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k,
                                            dropout_p, softmax_scale, bool(causal), *window,
                                            softcap, alibi_slopes, debug, bool(deterministic))
    if not return_attn_probs:
        return out
    varlen = Varlen(cu_seqlens_q, cu_seqlens_k, max_q, max_k)
    return out, lse, _s_dmask(dmask if debug else None, q, k, softmax_scale, bool(causal),
                              window, varlen, softcap, alibi_slopes)


def _unpack(api: str, packed, name: str, dim: int, count: int, rank: int, layout: str):
    """The ``count`` tensors packed along ``dim`` of ``packed`` (views: their
    gradients flow back into ``packed``)."""
    if not isinstance(packed, torch.Tensor):
        _fail(api, f"{name} must be a tensor, got {type(packed).__name__}")
    if packed.dim() != rank or packed.shape[dim] != count:
        _fail(api, f"{name} must be {layout}, got shape {tuple(packed.shape)}")
    return packed.unbind(dim)


def flash_attn_qkvpacked_func(qkv: torch.Tensor, dropout_p: float = 0.0,
                              softmax_scale: float | None = None, causal: bool = False,
                              window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: torch.Tensor | None = None,
                              deterministic: bool = False, return_attn_probs: bool = False):
    """flash-attn's ``flash_attn_qkvpacked_func``: :func:`flash_attn_func` on
    ``qkv`` (batch, seqlen, 3, nheads, headdim) (q, k, v along dim 2); the
    gradient is ``qkv``'s, of its packed shape."""
    q, k, v = _unpack("flash_attn_qkvpacked_func", qkv, "qkv", 2, 3, 5,
                      "(batch, seqlen, 3, nheads, headdim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, dropout_p: float = 0.0,
                             softmax_scale: float | None = None, causal: bool = False,
                             window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: torch.Tensor | None = None,
                             deterministic: bool = False, return_attn_probs: bool = False):
    """flash-attn's ``flash_attn_kvpacked_func``: :func:`flash_attn_func` on
    q (batch, seqlen_q, nheads, headdim) and ``kv`` (batch, seqlen_k, 2,
    nheads_k, headdim) (k, v along dim 2; GQA when nheads_k < nheads)."""
    k, v = _unpack("flash_attn_kvpacked_func", kv, "kv", 2, 2, 5,
                   "(batch, seqlen_k, 2, nheads_k, headdim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv: torch.Tensor, cu_seqlens: torch.Tensor,
                                     max_seqlen: int, dropout_p: float = 0.0,
                                     softmax_scale: float | None = None, causal: bool = False,
                                     window_size: tuple[int, int] = (-1, -1),
                                     softcap: float = 0.0,
                                     alibi_slopes: torch.Tensor | None = None,
                                     deterministic: bool = False,
                                     return_attn_probs: bool = False):
    """flash-attn's ``flash_attn_varlen_qkvpacked_func``:
    :func:`flash_attn_varlen_func` on ``qkv`` (total, 3, nheads, headdim),
    one ``cu_seqlens`` / ``max_seqlen`` for queries and keys."""
    q, k, v = _unpack("flash_attn_varlen_qkvpacked_func", qkv, "qkv", 1, 3, 4,
                      "(total, 3, nheads, headdim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q: torch.Tensor, kv: torch.Tensor,
                                    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                                    max_seqlen_q: int, max_seqlen_k: int,
                                    dropout_p: float = 0.0, softmax_scale: float | None = None,
                                    causal: bool = False,
                                    window_size: tuple[int, int] = (-1, -1),
                                    softcap: float = 0.0,
                                    alibi_slopes: torch.Tensor | None = None,
                                    deterministic: bool = False,
                                    return_attn_probs: bool = False):
    """flash-attn's ``flash_attn_varlen_kvpacked_func``:
    :func:`flash_attn_varlen_func` on q (total_q, nheads, headdim) and ``kv``
    (total_k, 2, nheads_k, headdim)."""
    k, v = _unpack("flash_attn_varlen_kvpacked_func", kv, "kv", 1, 2, 4,
                   "(total_k, 2, nheads_k, headdim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs)
