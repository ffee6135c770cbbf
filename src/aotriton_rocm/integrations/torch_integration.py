"""Plugging our attention into torch: the flash ops on the CUDA key (ROCm
tensors use it too), and the CPU flash ops when the interpreter backend is
asked for.

Route (a), torch >= 2.10: we register with ``torch.nn.attention``'s flash
registry under ``IMPL_NAME``; the user activates it with
``activate_flash_attention_impl(IMPL_NAME)`` or :func:`aotriton_rocm.enable`.
Without the registry, :func:`enable` installs the same overrides directly.
Whatever our kernels don't cover goes to torch's own kernel, with a one-time
warning naming the reason: on torch >= 2.9 the kernel torch had registered
before us (``torch.library.get_kernel``); on torch 2.5-2.8, which cannot
hand that kernel out, the lower-level op torch's SDPA kernel itself calls
(:data:`_SUBOP_FALLBACKS`), and ops without one are left to torch.
"""

from __future__ import annotations

import collections
import functools
import os
import threading
import types
import warnings

import torch

from ..common.trace import span
from ..core.device import gpu_available
from ..core.native import NativeError
from ..core.philox_state import efficient_dims, flash_dims, next_state_and_values
from ..core.registry import IMPL_NAME, has_registry
from ..core.registry import register as _registry_register
from ..core.torch_compat import check_torch
from ..core.torch_native import (activate as activate_torch_native,
                                 process_archives as torch_native_archives,
                                 wanted as torch_native_wanted)
from .flash_attn_ops import PYTHON_ROUTES


@functools.lru_cache(maxsize=None)
def _route() -> types.SimpleNamespace:
    """The Python route's modules, imported on its first call: enable() on
    the C++ route never needs them (part of its cold-start budget). Named in
    full: ``from . import`` would also name the package, whose lazy names
    lead back here."""
    import aotriton_rocm.core.attention as attention
    import aotriton_rocm.core.backends as backends
    import aotriton_rocm.core.dropout_masks as dropout_masks
    import aotriton_rocm.core.kvcache as kvcache
    return types.SimpleNamespace(attention=attention, backends=backends,
                                 dropout_masks=dropout_masks, kvcache=kvcache)


CPU_ENV = "AOTRITON_ROCM_CPU_INTERPRETER"

_FLASH = "aten::_scaled_dot_product_flash_attention"
_FLASH_BWD = "aten::_scaled_dot_product_flash_attention_backward"
_CPU_FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"
_CPU_FLASH_BWD = "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
_FA = "aten::_flash_attention_forward"
_FA_BWD = "aten::_flash_attention_backward"
_EFF = "aten::_scaled_dot_product_efficient_attention"
_EFF_BWD = "aten::_scaled_dot_product_efficient_attention_backward"
_FILL = "aten::_fill_mem_eff_dropout_mask_"

_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_fallback(op: str, reason: str) -> None:
    with _warn_lock:
        if reason in _warned:
            return
        _warned.add(reason)
    warnings.warn(f"aotriton-rocm: {op} falls back to torch's kernel: {reason}",
                  stacklevel=3)


@functools.lru_cache(maxsize=1)
def _rng_layout() -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    """(shape, dtype) of the flash op's two RNG-state outputs in this torch
    build, by the rule of torch's meta kernel (torch/_meta_registrations.py):
    ROCm builds and torch < 2.7 return an int64 seed and offset of shape ();
    CUDA builds of torch >= 2.7 a uint64 (2,) ``rng_state`` and an unused
    uint64 (). Not by calling that kernel: its first call imports torch's
    meta registrations, seconds of every enable()."""
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    if torch.version.hip or (major, minor) < (2, 7):
        return (((), torch.int64), ((), torch.int64))
    return (((2,), torch.uint64), ((), torch.uint64))


@functools.lru_cache(maxsize=None)
def _aux_outputs(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """RNG state, ``unused`` and debug mask, as torch's meta kernel shapes them
    for this build. Without dropout and without a debug mask nothing reads or
    writes them, so one unfilled set per device and dtype serves every call
    (allocating them costs more than the attention at small sizes)."""
    seed, offset = (torch.empty(shape, dtype=dt, device=device) for shape, dt in _rng_layout())
    return seed, offset, torch.empty(0, dtype=dtype, device=device)


@functools.lru_cache(maxsize=None)
def _unused_int64(device: torch.device) -> torch.Tensor:
    return torch.empty((), dtype=torch.int64, device=device)


def _flash_rng_outputs(device: torch.device, batch: int, heads: int, dropout_p: float):
    """The Philox state of a flash-op call as the flash ops return it on this
    build (see :func:`_rng_layout`): a seed and an offset, or a (2,)
    ``rng_state`` holding both and an unused (). With dropout it is torch's
    generator's, advanced by 32 * batch * heads as torch's flash kernels
    advance it; without (a debug mask at p = 0: nothing is dropped, any state
    gives the same mask) zeros, and the generator is left alone, as torch's."""
    attention = _route().attention
    if dropout_p:
        state = attention.new_rng_state(device, flash_dims(batch, heads))
    else:
        state = torch.zeros(2, dtype=torch.int64, device=device)
    (seed_shape, seed_dtype), (_, offset_dtype) = _rng_layout()
    if seed_shape == (2,):
        return state.view(seed_dtype), torch.empty((), dtype=offset_dtype, device=device)
    return state[0].view(seed_dtype), state[1].view(offset_dtype)


def _rng_inputs(seed: torch.Tensor, offset: torch.Tensor):
    """The kernels' (seed, offset) int64 scalars from what a forward returned."""
    if seed.numel() == 2:  # CUDA's (2,) rng_state
        state = seed.view(torch.int64)
        return state[0], state[1]
    return seed.view(torch.int64), offset.view(torch.int64)


def _varlen(cum_seq_q, cum_seq_k, max_q, max_k):
    attention = _route().attention
    if cum_seq_q is None and cum_seq_k is None:
        return None
    if cum_seq_q is None or cum_seq_k is None:
        raise Unsupported("cum_seq_q and cum_seq_k must be given together")
    return attention.Varlen(cum_seq_q, cum_seq_k, int(max_q), int(max_k))


class Unsupported(Exception):
    """Raised by the op functions below when our kernels don't cover a call;
    the message is the reason (the override falls back to torch's kernel)."""


def _bhsd(t: torch.Tensor, varlen) -> torch.Tensor:
    """flash-attn's (B, S, H, D) as (B, H, S, D); packed (total, H, D) stays."""
    return t if varlen is not None else t.transpose(1, 2)


def _fa_reason(query, key, value, varlen, dropout_p, return_debug_mask=False,
               alibi_slopes=None, **unsupported_kwargs) -> str | None:
    attention = _route().attention
    for name, val in unsupported_kwargs.items():
        if val is not None:
            return f"{name} is not supported yet"
    if varlen is None and (query.dim() != 4 or key.dim() != 4 or value.dim() != 4):
        return "query/key/value must be 4-D (batch, seqlen, heads, head_dim)"
    return attention.unsupported_reason(
        _bhsd(query, varlen), _bhsd(key, varlen), _bhsd(value, varlen), dropout_p=dropout_p,
        return_debug_mask=return_debug_mask, varlen=varlen, alibi_slopes=alibi_slopes)


def flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
                            dropout_p, is_causal, return_debug_mask, *, scale=None,
                            window_size_left=None, window_size_right=None, seqused_k=None,
                            alibi_slopes=None, block_table=None, num_splits=None):
    """``aten::_flash_attention_forward`` on our kernels: (B, S, H, D) tensors
    or packed (total, H, D) ones with ``cum_seq_q/k`` (variable-length
    batches), bottom-right causal, flash-attn's sliding window, dropout,
    ALiBi (``alibi_slopes``: fp32 (H,) or (B, H)); ``seqused_k``, a paged
    key/value with ``block_table`` and ``num_splits > 1`` on the KV-cache
    kernels (fp16/bf16, head dim <= 256, no dropout). Outputs are shaped as
    torch's meta kernel shapes them. Raises :class:`Unsupported`.

    torch's ``_flash_attention_backward`` takes no slopes (torch's own kernel
    computes that gradient without ALiBi, whatever the forward had): ours
    computes the same."""
    attention = _route().attention
    varlen = _varlen(cum_seq_q, cum_seq_k, max_q, max_k)
    if seqused_k is not None or block_table is not None or (num_splits or 0) > 1:
        return _fa_kvcache_forward(query, key, value, varlen, int(max_k), dropout_p, is_causal,
                                   return_debug_mask, scale, window_size_left, window_size_right,
                                   seqused_k, alibi_slopes, block_table, num_splits)
    # num_splits 0 (automatic) or 1: the one-pass kernel (it does not split;
    # the result is the same)
    reason = _fa_reason(query, key, value, varlen, dropout_p, return_debug_mask,
                        alibi_slopes=alibi_slopes)
    if reason:
        raise Unsupported(reason)
    seqlen_k = key.size(1) if varlen is None else varlen.max_seqlen_k
    window = attention.flash_attn_window(window_size_left, window_size_right, seqlen_k)
    out = torch.empty_like(query)
    seed, offset, debug = _aux_outputs(query.device, query.dtype)
    rng = None
    if dropout_p or return_debug_mask:
        batch = query.size(0) if varlen is None else varlen.batch
        seed, offset = _flash_rng_outputs(query.device, batch, query.size(-2), dropout_p)
        rng = _rng_inputs(seed, offset)
    if return_debug_mask:
        # (B, H, Sq, Sk); a variable-length batch (B, H, max_q, max_k), sequence
        # b at the top left of [b].
        b, h, _, sq, sk, _ = attention.problem_dims(_bhsd(query, varlen), _bhsd(key, varlen),
                                                    varlen)
        debug = torch.zeros((b, h, sq, sk), dtype=query.dtype, device=query.device)
    _, lse = attention.forward(_bhsd(query, varlen), _bhsd(key, varlen), _bhsd(value, varlen),
                               is_causal=is_causal, scale=scale, out=_bhsd(out, varlen),
                               causal_alignment="bottom_right", window_size=window,
                               dropout_p=dropout_p, rng=rng,
                               debug_mask=debug if return_debug_mask else None, varlen=varlen,
                               alibi_slopes=alibi_slopes)
    return out, lse, seed, offset, debug


def _fa_key_ranges(key, varlen, seqused_k, block_table):
    """The KV-cache kernels' view of ``_flash_attention_forward``'s keys:
    (k_cache, v_cache index (batch rows), k_start, k_end, cache_batch_idx).
    Paged keys: batch b's first ``seqused_k[b]`` (or cu_seqlens_k's length,
    or every) positions of its block table; packed keys: rows
    ``cu_seqlens_k[b] ..`` of one cache row; dense: the first ``seqused_k[b]``
    keys of row b."""
    if block_table is not None:
        if seqused_k is not None:
            k_end = seqused_k
        elif varlen is not None:
            k_end = varlen.cu_seqlens_k.diff()
        else:
            k_end = torch.full((block_table.shape[0],), block_table.shape[1] * key.shape[1],
                               dtype=torch.int32, device=key.device)
        return k_end, None, None
    if varlen is not None:
        starts = varlen.cu_seqlens_k[:-1]
        used = varlen.cu_seqlens_k.diff() if seqused_k is None else seqused_k
        batch = varlen.batch
        return starts + used, starts, torch.zeros(batch, dtype=torch.int32, device=key.device)
    return seqused_k, None, None


def _fa_kvcache_forward(query, key, value, varlen, max_k, dropout_p, is_causal,
                        return_debug_mask, scale, window_size_left, window_size_right, seqused_k,
                        alibi_slopes, block_table, num_splits):
    """``_flash_attention_forward`` with ``seqused_k``, a paged ``key``/``value``
    (``block_table``) or ``num_splits > 1``, on the KV-cache kernels (flash-attn's
    varlen semantics: batch b's keys are its first ``seqused_k[b]``, causal
    and windows aligned bottom-right with them)."""
    attention = _route().attention
    kvcache = _route().kvcache
    if dropout_p or return_debug_mask:
        raise Unsupported("dropout or a debug mask with seqused_k, block_table or num_splits "
                          "is not covered")
    for name, t in (("seqused_k", seqused_k), ("block_table", block_table)):
        if t is not None and t.device != query.device:
            raise Unsupported(f"{name} must be on the query's device")
    paged = block_table is not None
    if not paged and key.dim() != (3 if varlen is not None else 4):
        raise Unsupported("key/value must be (batch, seqlen, heads, head_dim), packed (total, "
                          "heads, head_dim), or paged (num_blocks, page_size, heads, head_dim) "
                          "with block_table")
    if seqused_k is not None and (seqused_k.dtype != torch.int32 or seqused_k.dim() != 1):
        raise Unsupported("seqused_k must be a 1-D int32 tensor")
    k_cache, v_cache = key, value
    if varlen is not None and not paged:
        k_cache, v_cache = key.unsqueeze(0), value.unsqueeze(0)
    k_end, k_start, batch_idx = _fa_key_ranges(key, varlen, seqused_k, block_table)
    if k_end is None:  # dense keys, num_splits alone: every key
        k_end = torch.full((query.shape[0],), key.shape[1], dtype=torch.int32, device=key.device)
    cu_q = None if varlen is None else varlen.cu_seqlens_q
    reason = kvcache.unsupported_reason(query, k_cache, v_cache, k_end=k_end, k_start=k_start,
                                        cache_batch_idx=batch_idx, block_table=block_table,
                                        alibi_slopes=alibi_slopes, cu_seqlens_q=cu_q)
    if reason:
        raise Unsupported(reason)
    capacity = block_table.shape[1] * key.shape[1] if paged else k_cache.shape[1]
    window = attention.flash_attn_window(window_size_left, window_size_right,
                                         max_k if max_k > 0 else capacity)
    out, lse, _ = kvcache.forward(
        query, k_cache, v_cache, k_end, k_start=k_start, cache_batch_idx=batch_idx,
        block_table=block_table, alibi_slopes=alibi_slopes, scale=scale, causal=bool(is_causal),
        window_size=window, num_splits=int(num_splits or 0), cu_seqlens_q=cu_q,
        max_seqlen_q=varlen.max_seqlen_q if varlen is not None else 0)
    seed, offset, debug = _aux_outputs(query.device, query.dtype)
    return out, lse, seed, offset, debug


def flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                             max_q, max_k, dropout_p, is_causal, rng_state, unused, *,
                             scale=None, window_size_left=None, window_size_right=None):
    """``aten::_flash_attention_backward`` on our kernels (see
    :func:`flash_attention_forward`); gradients are ``empty_like`` the inputs,
    as torch's meta kernel. Raises :class:`Unsupported`."""
    attention = _route().attention
    varlen = _varlen(cum_seq_q, cum_seq_k, max_q, max_k)
    if varlen is not None and query.dim() == 3 and key.dim() == 4:
        # packed queries against paged keys: the forward had a block_table,
        # which this op does not receive; no kernel (torch's neither) has
        # this backward, and computing one as packed keys would be wrong.
        raise NotImplementedError(
            "aotriton-rocm: _flash_attention_backward of a paged KV cache (the forward had a "
            "block_table): there is no backward through a paged KV cache. To train, pass key "
            "and value packed (total_k, heads, head_dim) without block_table; for inference, "
            "run the forward under torch.no_grad()")
    reason = _fa_reason(query, key, value, varlen, dropout_p)
    if reason:
        raise Unsupported(reason)
    seqlen_k = key.size(1) if varlen is None else varlen.max_seqlen_k
    window = attention.flash_attn_window(window_size_left, window_size_right, seqlen_k)
    grads = tuple(torch.empty_like(t) for t in (query, key, value))
    attention.backward(_bhsd(grad_out, varlen), _bhsd(query, varlen), _bhsd(key, varlen),
                       _bhsd(value, varlen), _bhsd(out, varlen), logsumexp,
                       is_causal=is_causal, scale=scale,
                       grads=tuple(_bhsd(g, varlen) for g in grads),
                       causal_alignment="bottom_right", window_size=window, dropout_p=dropout_p,
                       rng=_rng_inputs(rng_state, unused) if dropout_p else None, varlen=varlen)
    return grads


def efficient_attention_forward(query, key, value, attn_bias, compute_log_sumexp,
                                dropout_p=0.0, is_causal=False, *, scale=None):
    """``aten::_scaled_dot_product_efficient_attention`` on our kernels: (B, H,
    S, D) tensors of any covered dtype (fp32 too), an additive bias (attn_mask)
    broadcast to (B, H, Sq, Sk), top-left causal, dropout. Outputs are laid
    out as torch's meta kernel lays them out. Raises :class:`Unsupported`."""
    attention = _route().attention
    reason = attention.unsupported_reason(query, key, value, dropout_p=dropout_p,
                                          is_causal=is_causal, attn_mask=attn_bias)
    if reason:
        raise Unsupported(reason)
    b, h, sq, _ = query.shape
    out = torch.empty((b, sq, h, value.size(-1)), dtype=query.dtype,
                      device=query.device).transpose(1, 2)
    rows = sq if torch.version.hip else -(-sq // 32) * 32
    lse = torch.empty((b, h, rows if compute_log_sumexp else 0), dtype=torch.float32,
                      device=query.device)
    if dropout_p:
        state, values = next_state_and_values(query.device, efficient_dims(b, h, sq, key.size(2)))
        seed, offset = state[0], state[1]
        _note_our_philox(values)
    else:
        seed = offset = _unused_int64(query.device)
    attention.forward(query, key, value, is_causal=is_causal, scale=scale, out=out,
                      causal_alignment="top_left", bias=attn_bias, dropout_p=dropout_p,
                      rng=(seed, offset) if dropout_p else None,
                      lse=lse if compute_log_sumexp else None)
    return out, lse, seed, offset


def efficient_attention_backward(grad_out, query, key, value, attn_bias, out, logsumexp,
                                 philox_seed, philox_offset, dropout_p, grad_input_mask,
                                 is_causal=False, *, scale=None):
    """``aten::_scaled_dot_product_efficient_attention_backward`` on our
    kernels (see :func:`efficient_attention_forward`): dQ, dK, dV and, when
    asked for, the bias gradient. Raises :class:`Unsupported`."""
    attention = _route().attention
    reason = attention.unsupported_reason(query, key, value, dropout_p=dropout_p,
                                          is_causal=is_causal, attn_mask=attn_bias)
    if reason:
        raise Unsupported(reason)
    grads = tuple(torch.empty_permuted(t.size(), (0, 2, 1, 3), dtype=t.dtype, device=t.device)
                  for t in (query, key, value))
    bias_grad = full_grad = None
    if attn_bias is not None and grad_input_mask[3]:
        # Shaped like attn_bias (as torch's meta kernel); the kernels write
        # the full (B, H, Sq, Sk) gradient, summed over broadcast dims here.
        bias_grad = attention.new_bias_grad(attn_bias.shape, attn_bias.dtype, query.device)
        full = (*query.shape[:3], key.size(2))
        full_grad = (bias_grad if tuple(attn_bias.shape) == full
                     else attention.new_bias_grad(full, attn_bias.dtype, query.device))
    attention.backward(grad_out, query, key, value, out, logsumexp, is_causal=is_causal,
                       scale=scale, grads=grads, causal_alignment="top_left", bias=attn_bias,
                       bias_grad=full_grad, dropout_p=dropout_p,
                       rng=(philox_seed, philox_offset) if dropout_p else None)
    if full_grad is not None and full_grad is not bias_grad:
        bias_grad.copy_(full_grad.sum_to_size(attn_bias.shape))
    return (*grads, bias_grad)


# (seed, offset) of efficient-op calls that torch's kernel served (a call our
# kernels do not cover): its mask is torch's to regenerate, until one of our
# calls draws the same pair (both draw from torch's generator). Newest last.
_TORCH_PHILOX: "collections.OrderedDict[tuple[int, int], None]" = collections.OrderedDict()
_TORCH_PHILOX_KEEP = 4096


def _note_torch_philox(seed, offset) -> None:
    """Remember the Philox state torch's efficient kernel returned, where
    reading it costs nothing: CUDA builds return host scalars outside graph
    capture (device scalars, as ROCm builds return, are left unread: that
    would synchronise every such call)."""
    if not (isinstance(seed, torch.Tensor) and isinstance(offset, torch.Tensor)):
        return
    if seed.device.type != "cpu" or offset.device.type != "cpu" or seed.numel() != 1 \
            or offset.numel() != 1:
        return
    with _warn_lock:
        _TORCH_PHILOX[(int(seed.item()), int(offset.item()))] = None
        while len(_TORCH_PHILOX) > _TORCH_PHILOX_KEEP:
            _TORCH_PHILOX.popitem(last=False)


def _note_our_philox(values) -> None:
    """Our kernels draw (seed, offset) now: a fallback call that drew it
    earlier (before a ``torch.manual_seed``) no longer owns it."""
    if values is not None and _TORCH_PHILOX:
        with _warn_lock:
            _TORCH_PHILOX.pop(values, None)


def fill_mem_eff_dropout_mask(mask, dropout_p, seed, offset):
    """``aten::_fill_mem_eff_dropout_mask_`` as our kernels drew the mask:
    torch's tests regenerate the efficient op's dropout mask with it from the
    ``philox_seed/offset`` the op returned (as ints). Writes the draws u in
    (0, 1] of the kept-iff-``u > dropout_p`` rule (what torch's CUDA kernel
    writes: its tests read ``u > dropout_p``), or on ROCm builds of torch
    0.5 where kept and -0.5 where dropped (torch's ROCm encoding: its tests
    read ``> 0``). Raises :class:`Unsupported` where torch's kernel must
    serve the call (a tensor torch's own checks refuse; no kernel image for
    the device: then the efficient op ran torch's kernels too; or the seed
    and offset torch's efficient kernel returned when our override fell back
    to it, as far as they can be read without a device synchronisation: CUDA
    builds outside graph capture)."""
    backends = _route().backends
    dropout_masks = _route().dropout_masks
    if mask.dtype != torch.float32 or mask.dim() != 4 or not mask.is_contiguous():
        raise Unsupported("the mask is not a contiguous float32 4-D tensor")
    if (int(seed), int(offset)) in _TORCH_PHILOX:
        raise Unsupported("torch's kernel drew this mask (the efficient op fell back to it)")
    backend = backends.backend_for(mask)
    if backend is None or getattr(backend, "problem", None):
        raise Unsupported(getattr(backend, "problem", None) or f"no backend for {mask.device}")
    try:
        return dropout_masks.fill_dropout_uniform(mask, seed, offset, dropout_p=dropout_p,
                                                  encode_keep=bool(torch.version.hip))
    except NativeError as exc:
        raise RuntimeError(
            f"aotriton-rocm: cannot regenerate the dropout mask our kernels drew ({exc}); "
            "install the kernel image that matches this aotriton-rocm") from None


def _cpu_reason(query, key, value, dropout_p, attn_mask) -> str | None:
    attention = _route().attention
    if dropout_p:
        # The CPU op returns no RNG state for its backward to regenerate the mask from.
        return "dropout on the CPU op is not covered"
    return attention.unsupported_reason(query, key, value, attn_mask=attn_mask)


def _routed(op: str, implementation):
    """An override of ``op`` running ``implementation``, or torch's kernel
    when it raises :class:`Unsupported`."""
    def kernel(self, keyset, *args, **kwargs):
        try:
            return implementation(*args, **kwargs)
        except Unsupported as exc:
            return self._fallback(op, keyset, str(exc), *args, **kwargs)
    return kernel


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)


# Custom mask types of torch's efficient-attention ops.
_NO_MASK, _CAUSAL_TOP_LEFT = 0, 1


def _flash_by_subop(query, key, value, dropout_p=0.0, is_causal=False,
                    return_debug_mask=False, *, scale=None):
    """torch's CUDA ``_scaled_dot_product_flash_attention``, as that kernel
    computes it: ``_flash_attention_forward`` on (B, S, H, D) views."""
    sq, sk = query.size(2), key.size(2)
    out, lse, seed, offset, debug = torch.ops.aten._flash_attention_forward(
        _t(query), _t(key), _t(value), None, None, sq, sk, dropout_p, is_causal,
        return_debug_mask, scale=scale)
    return _t(out), lse, None, None, sq, sk, seed, offset, debug


def _flash_bwd_by_subop(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                        max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *,
                        scale=None):
    grads = torch.ops.aten._flash_attention_backward(
        _t(grad_out), _t(query), _t(key), _t(value), _t(out), logsumexp, cum_seq_q, cum_seq_k,
        max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, scale=scale)
    return tuple(_t(g) for g in grads)


def _efficient_by_subop(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                        is_causal=False, *, scale=None):
    out, lse, seed, offset, _, _ = torch.ops.aten._efficient_attention_forward(
        _t(query), _t(key), _t(value), attn_bias, None, None, None, None, dropout_p,
        _CAUSAL_TOP_LEFT if is_causal else _NO_MASK, compute_log_sumexp, scale=scale)
    return _t(out), lse, seed, offset


def _efficient_bwd_by_subop(grad_out, query, key, value, attn_bias, out, logsumexp,
                            philox_seed, philox_offset, dropout_p, grad_input_mask,
                            is_causal=False, *, scale=None):
    dq, dk, dv, dbias = torch.ops.aten._efficient_attention_backward(
        _t(grad_out), _t(query), _t(key), _t(value), attn_bias, _t(out), None, None,
        query.size(2), key.size(2), logsumexp, dropout_p, philox_seed, philox_offset,
        _CAUSAL_TOP_LEFT if is_causal else _NO_MASK, bool(grad_input_mask[3]), scale=scale)
    return _t(dq), _t(dk), _t(dv), dbias


# torch's own kernel of an SDPA-level CUDA op, for torch < 2.9: the
# lower-level op it calls (which we leave alone there).
_SUBOP_FALLBACKS = {_FLASH: _flash_by_subop, _FLASH_BWD: _flash_bwd_by_subop,
                    _EFF: _efficient_by_subop, _EFF_BWD: _efficient_bwd_by_subop}


class _Overrides:
    """The kernels we put on the dispatcher; ``remove()`` gives torch's back."""

    def __init__(self, cpu: bool, native: bool = False):
        self._lib = torch.library.Library("aten", "IMPL")
        self._orig = {}
        self._fill_orig: dict = {}
        self._native = None
        cuda = self.cuda_kernels()
        if native:
            self._native = _activate_native(self, cuda)
        if self._native is None:
            for op, fn in cuda.items():
                self._register(op, "CUDA", fn)
        if cpu:
            self._register(_CPU_FLASH, "CPU", self._cpu_fwd)
            self._register(_CPU_FLASH_BWD, "CPU", self._cpu_bwd)
        # torch's regeneration of the efficient op's dropout mask, in Python
        # on every route (the six ops may be served by the C++ extension).
        for key in ("CUDA", "CPU") if cpu else ("CUDA",):
            self._register_fill(key)

    def cuda_kernels(self) -> dict:
        """The six CUDA-key overrides by op (also the native route's Python route)."""
        return {_FLASH: self._flash_fwd, _FLASH_BWD: self._flash_bwd, _FA: self._fa_fwd,
                _FA_BWD: self._fa_bwd, _EFF: self._eff_fwd, _EFF_BWD: self._eff_bwd}

    def _capture(self, op: str, key: str) -> bool:
        """Keep torch's kernel of ``op`` for the fallback; False: leave ``op`` alone."""
        if op in self._orig:
            return True
        if hasattr(torch.library, "get_kernel"):
            try:
                kernel = torch.library.get_kernel(op, key)
            except RuntimeError:
                return False  # this torch build has no kernel there (a CPU-only build's CUDA key)
            self._orig[op] = kernel.call_boxed
        elif op in _SUBOP_FALLBACKS:
            subop = _SUBOP_FALLBACKS[op]
            self._orig[op] = lambda keyset, *args, **kwargs: subop(*args, **kwargs)
        elif key == "CPU":
            self._orig[op] = None  # the CPU interpreter route (testing): an error instead
        else:
            return False  # torch < 2.9 could not fall back from it: leave the op to torch
        return True

    def _register(self, op: str, key: str, fn) -> None:
        if not self._capture(op, key):
            return
        with warnings.catch_warnings():
            # Overriding torch's kernel is the point; its one-time warning says so.
            warnings.filterwarnings("ignore",
                                    message="(?s).*Overriding a previously registered kernel")
            self._lib.impl(op.split("::")[1], fn, key, with_keyset=True)

    def _register_fill(self, key: str) -> None:
        """Our ``_fill_mem_eff_dropout_mask_`` on ``key``, also where torch
        cannot hand out its kernel (torch < 2.9) or has none (CPU): the op
        only serves tests, and a call we cannot serve raises then."""
        if not hasattr(torch.ops.aten, _FILL.split("::")[1]):
            return  # a torch without the op
        fallback = None
        if hasattr(torch.library, "get_kernel"):
            try:
                fallback = torch.library.get_kernel(_FILL, key).call_boxed
            except RuntimeError:
                pass  # no kernel of torch's there
        self._fill_orig[key] = fallback
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore",
                                    message="(?s).*Overriding a previously registered kernel")
            self._lib.impl(_FILL.split("::")[1], self._fill, key, with_keyset=True)

    def _fill(self, keyset, mask, dropout_p, seed, offset):
        try:
            return fill_mem_eff_dropout_mask(mask, dropout_p, seed, offset)
        except Unsupported as exc:
            key = "CPU" if mask.device.type == "cpu" else "CUDA"
            original = self._fill_orig.get(key)
            if original is None:
                why = ("torch has no kernel of its own for this device" if key == "CPU" or
                       hasattr(torch.library, "get_kernel") else
                       f"torch {torch.__version__} cannot hand its own kernel back "
                       "(torch.library.get_kernel arrived in torch 2.9)")
                raise RuntimeError(
                    f"aotriton-rocm: _fill_mem_eff_dropout_mask_ is not ours to serve here "
                    f"({exc}), and {why}: call aotriton_rocm.disable() around it") from None
            _warn_fallback("_fill_mem_eff_dropout_mask_", str(exc))
            return original(keyset, mask, dropout_p, seed, offset)

    def remove(self) -> None:
        global _active
        if _active is self:  # torch's restore_flash_attention_impl() ends here too
            _active = None
        if self._native is not None:
            self._native.remove()
            self._native = None
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None

    def _fallback(self, op, keyset, reason, *args, **kwargs):
        name = op.split("::")[1]
        if self._orig.get(op) is None:
            raise NotImplementedError(
                f"aotriton-rocm's CPU interpreter route does not cover this {name} call "
                f"({reason}), and torch {torch.__version__} cannot hand it back to torch's "
                "CPU kernel (torch.library.get_kernel arrived in torch 2.9): call "
                "aotriton_rocm.disable() around such calls, or use torch >= 2.9")
        _warn_fallback(name, reason)
        return self._orig[op](keyset, *args, **kwargs)

    # aten::_scaled_dot_product_flash_attention
    def _flash_fwd(self, keyset, query, key, value, dropout_p=0.0, is_causal=False,
                   return_debug_mask=False, *, scale=None):
        attention = _route().attention
        reason = attention.unsupported_reason(query, key, value, dropout_p=dropout_p,
                                              is_causal=is_causal,
                                              return_debug_mask=return_debug_mask)
        if reason:
            return self._fallback(_FLASH, keyset, reason, query, key, value, dropout_p,
                                  is_causal, return_debug_mask, scale=scale)
        # On this op is_causal with seqlen_q != seqlen_k means bottom-right
        # (torch's causal_lower_right calls it so; F.sdpa's selector sends it
        # only square causal inputs).
        seed, offset, debug = _aux_outputs(query.device, query.dtype)
        rng = None
        if dropout_p or return_debug_mask:
            seed, offset = _flash_rng_outputs(query.device, query.size(0), query.size(1),
                                              dropout_p)
            rng = _rng_inputs(seed, offset)
        if return_debug_mask:
            debug = torch.zeros((*query.shape[:3], key.size(2)), dtype=query.dtype,
                                device=query.device)
        out, lse = attention.forward(query, key, value, is_causal=is_causal, scale=scale,
                                     causal_alignment="bottom_right", dropout_p=dropout_p,
                                     rng=rng, debug_mask=debug if return_debug_mask else None)
        return out, lse, None, None, query.size(2), key.size(2), seed, offset, debug

    # aten::_scaled_dot_product_flash_attention_backward
    def _flash_bwd(self, keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q,
                   cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset,
                   *, scale=None):
        attention = _route().attention
        reason = attention.unsupported_reason(query, key, value, dropout_p=dropout_p,
                                              is_causal=is_causal)
        if reason:
            return self._fallback(_FLASH_BWD, keyset, reason, grad_out, query, key, value, out,
                                  logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                                  is_causal, philox_seed, philox_offset, scale=scale)
        return attention.backward(grad_out, query, key, value, out, logsumexp,
                                  is_causal=is_causal, scale=scale,
                                  causal_alignment="bottom_right", dropout_p=dropout_p,
                                  rng=_rng_inputs(philox_seed, philox_offset) if dropout_p else None)

    # Ops whose implementation raises Unsupported: torch's kernel takes the
    # very same call then. _flash_attention_forward is (B, S, H, D); torch
    # 2.13 adds block_table and num_splits to it.
    _fa_fwd = _routed(_FA, flash_attention_forward)
    _fa_bwd = _routed(_FA_BWD, flash_attention_backward)
    def _eff_fwd(self, keyset, *args, **kwargs):
        try:
            return efficient_attention_forward(*args, **kwargs)
        except Unsupported as exc:
            result = self._fallback(_EFF, keyset, str(exc), *args, **kwargs)
            _note_torch_philox(result[2], result[3])
            return result
    _eff_bwd = _routed(_EFF_BWD, efficient_attention_backward)

    # aten::_scaled_dot_product_flash_attention_for_cpu
    def _cpu_fwd(self, keyset, query, key, value, dropout_p=0.0, is_causal=False, *,
                 attn_mask=None, scale=None):
        attention = _route().attention
        reason = _cpu_reason(query, key, value, dropout_p, attn_mask)
        if reason:
            return self._fallback(_CPU_FLASH, keyset, reason, query, key, value, dropout_p,
                                  is_causal, attn_mask=attn_mask, scale=scale)
        # torch's CPU flash op (like its math backend) aligns causal top-left.
        out, lse = attention.forward(query, key, value, is_causal=is_causal, scale=scale,
                                     causal_alignment="top_left", bias=attn_mask)
        b, h, sq, _ = query.shape
        # torch's CPU kernel returns logsumexp as a (B, Sq, H) buffer viewed (B, H, Sq).
        lse_cpu = torch.empty((b, sq, h), dtype=torch.float32).transpose(1, 2)
        lse_cpu.copy_(lse)
        return out, lse_cpu

    # aten::_scaled_dot_product_flash_attention_for_cpu_backward
    def _cpu_bwd(self, keyset, grad_out, query, key, value, out, logsumexp, dropout_p,
                 is_causal, *, attn_mask=None, scale=None):
        attention = _route().attention
        reason = _cpu_reason(query, key, value, dropout_p, attn_mask)
        if reason:
            return self._fallback(_CPU_FLASH_BWD, keyset, reason, grad_out, query, key, value,
                                  out, logsumexp, dropout_p, is_causal, attn_mask=attn_mask,
                                  scale=scale)
        # torch's CPU meta kernel lays gradients out as (B, S, H, D).
        grads = tuple(torch.empty_permuted(t.size(), (0, 2, 1, 3), dtype=t.dtype)
                      for t in (query, key, value))
        return attention.backward(grad_out, query, key, value, out, logsumexp,
                                  is_causal=is_causal, scale=scale, grads=grads,
                                  causal_alignment="top_left", bias=attn_mask)


def _native_wanted() -> bool:
    """The C++ route (torch_native) for the registry route: torch >= 2.10
    with the extension installed, unless AOTRITON_ROCM_TORCH_NATIVE=0."""
    return has_registry() and torch_native_wanted()


def _activate_native(overrides: _Overrides, kernels: dict):
    """The C++ kernels on the CUDA key, with ``kernels`` (and our operators'
    Python routes) as their Python route; None (and a warning) if the
    extension cannot be activated."""
    with span("torch_kernels", "(torch.library.get_kernel of the six ops)"):
        for op in kernels:  # torch's kernels, for the Python route's fallback
            overrides._capture(op, "CUDA")
    try:
        with span("archive_search", "(the archives handed to the C++ runtime)"):
            archives = torch_native_archives()
        python_kernels = {op.split("::")[1]: fn for op, fn in kernels.items()}
        python_kernels.update(PYTHON_ROUTES)
        return activate_torch_native(
            python_kernels, rng_layout=_rng_layout(),
            efficient_lse_align=1 if torch.version.hip else 32, archives=archives)
    except (OSError, RuntimeError) as exc:
        warnings.warn(f"aotriton-rocm: the C++ route is unavailable ({exc}); "
                      "using the Python route", stacklevel=3)
        return None


_active: _Overrides | None = None
_cpu_requested = False


def _cpu_wanted() -> bool:
    return _cpu_requested or os.environ.get(CPU_ENV, "") == "1"


def _register_fn() -> _Overrides:
    # Called by torch's registry on activation; also by enable() without it.
    global _active
    check_torch(torch.__version__)  # refuse an unsupported torch (clear message)
    if _active is not None:
        _active.remove()
    with span("overrides", "(every kernel on torch's dispatcher)"):
        _active = _Overrides(cpu=_cpu_wanted(), native=_native_wanted())
    return _active


def register() -> None:
    """Make ``IMPL_NAME`` known to torch's registry; activates nothing."""
    _registry_register(_register_fn)


def enable(cpu_interpreter: bool = False) -> None:
    """Route torch's flash attention through aotriton-rocm.

    ``cpu_interpreter=True`` also routes CPU tensors through the kernel sources
    run by Triton's interpreter (slow: for testing without a GPU). Without it
    (or ``AOTRITON_ROCM_CPU_INTERPRETER=1``), a machine where torch sees no
    GPU is a RuntimeError: nothing of ours would run there.
    """
    global _cpu_requested
    check_torch(torch.__version__)  # UnsupportedTorchError names what to do
    if not cpu_interpreter and os.environ.get(CPU_ENV, "") != "1" and not gpu_available():
        # Our overrides sit on the CUDA key: with no GPU they would never run,
        # and "enabled" would be a lie while torch's CPU kernel does the work.
        raise RuntimeError(
            "aotriton-rocm: enable(): no GPU is visible to torch (torch.cuda.is_available() is "
            "False), so the precompiled kernels, registered for GPU tensors, would never run and "
            "torch's own kernel would. On a GPU machine, install the ROCm (or CUDA) build of "
            "torch; to run the kernel sources on the CPU through Triton's interpreter (slow, for "
            f"testing), call enable(cpu_interpreter=True) or set {CPU_ENV}=1.")
    _cpu_requested = cpu_interpreter
    if has_registry():
        register()
        torch.nn.attention.activate_flash_attention_impl(IMPL_NAME)
    else:
        _register_fn()


def disable() -> None:
    global _active
    if has_registry() and torch.nn.attention.current_flash_attention_impl() == IMPL_NAME:
        torch.nn.attention.restore_flash_attention_impl()
    if _active is not None:
        _active.remove()
        _active = None


def is_enabled() -> bool:
    return _active is not None
