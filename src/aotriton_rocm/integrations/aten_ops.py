"""torch's six attention ops (and the efficient op's dropout-mask fill) on
our kernels, the Python route: their arguments in the kernels' terms, the
RNG-state outputs torch's meta kernels lay out, and the calls our kernels
do not cover, raised as :class:`Unsupported` for torch_integration.py to
hand to torch's kernel. The kernels' modules load on the first call
(:func:`_route`).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
import types

import torch

from ..core.native import NativeError, refusal
from ..core.philox_state import efficient_dims, flash_dims, next_state_and_values


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


@contextlib.contextmanager
def _refusals_fall_back():
    """libaotriton_rocm's refusal of a call (nothing launched) as
    :class:`Unsupported`: torch's kernel takes the call."""
    try:
        yield
    except NativeError as exc:
        reason = refusal(exc)
        if reason is None:
            raise
        raise Unsupported(reason) from None


def _bhsd(t: torch.Tensor, varlen) -> torch.Tensor:
    """flash-attn's (B, S, H, D) as (B, H, S, D); packed (total, H, D) stays."""
    return t if varlen is not None else t.transpose(1, 2)


def _fa_reason(query, key, value, varlen, dropout_p, return_debug_mask=False,
               **unsupported_kwargs) -> str | None:
    attention = _route().attention
    for name, val in unsupported_kwargs.items():
        if val is not None:
            return f"{name} is not supported yet"
    if varlen is None and (query.dim() != 4 or key.dim() != 4 or value.dim() != 4):
        return "query/key/value must be 4-D (batch, seqlen, heads, head_dim)"
    return attention.unsupported_reason(
        _bhsd(query, varlen), _bhsd(key, varlen), _bhsd(value, varlen), dropout_p=dropout_p,
        return_debug_mask=return_debug_mask, varlen=varlen)


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
    reason = _fa_reason(query, key, value, varlen, dropout_p, return_debug_mask)
    if alibi_slopes is not None and alibi_slopes.device != query.device:
        reason = "alibi_slopes must be on the query's device"
    if reason:
        raise Unsupported(reason)
    window = (window_size_left, window_size_right)  # attention.mask_args applies the rule
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
    with _refusals_fall_back():  # the slopes are judged by the call
        _, lse = attention.forward(
            _bhsd(query, varlen), _bhsd(key, varlen), _bhsd(value, varlen), is_causal=is_causal,
            scale=scale, out=_bhsd(out, varlen), causal_alignment="bottom_right",
            window_size=window, dropout_p=dropout_p, rng=rng,
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
    for name, t in (("key", key), ("value", value), ("seqused_k", seqused_k),
                    ("block_table", block_table), ("alibi_slopes", alibi_slopes)):
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
    capacity = block_table.shape[1] * key.shape[1] if paged else k_cache.shape[1]
    window = attention.flash_attn_window(window_size_left, window_size_right,
                                         max_k if max_k > 0 else capacity)
    with _refusals_fall_back():
        out, lse, _ = kvcache.forward(
            query, k_cache, v_cache, k_end, k_start=k_start, cache_batch_idx=batch_idx,
            block_table=block_table, alibi_slopes=alibi_slopes, scale=scale,
            causal=bool(is_causal), window_size=window, num_splits=int(num_splits or 0),
            cu_seqlens_q=cu_q, max_seqlen_q=varlen.max_seqlen_q if varlen is not None else 0)
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
    window = (window_size_left, window_size_right)  # attention.mask_args applies the rule
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
_philox_lock = threading.Lock()
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
    with _philox_lock:
        _TORCH_PHILOX[(int(seed.item()), int(offset.item()))] = None
        while len(_TORCH_PHILOX) > _TORCH_PHILOX_KEEP:
            _TORCH_PHILOX.popitem(last=False)


def _note_our_philox(values) -> None:
    """Our kernels draw (seed, offset) now: a fallback call that drew it
    earlier (before a ``torch.manual_seed``) no longer owns it."""
    if values is not None and _TORCH_PHILOX:
        with _philox_lock:
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
