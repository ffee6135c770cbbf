"""Plugging our attention into torch: the flash ops on the CUDA key (ROCm
tensors use it too), and the CPU flash ops when the interpreter backend is
asked for.

Route (a), torch >= 2.10: we register with ``torch.nn.attention``'s flash
registry under ``IMPL_NAME``; the user activates it with
``activate_flash_attention_impl(IMPL_NAME)`` or :func:`aotriton_rocm.enable`.
Without the registry, :func:`enable` installs the same overrides directly.
Whatever our kernels don't cover goes to the kernel torch had registered
before us, with a one-time warning naming the reason.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings

import torch

from . import attention, torch_compat

IMPL_NAME = "AOTRITON_ROCM"
CPU_ENV = "AOTRITON_ROCM_CPU_INTERPRETER"

_FLASH = "aten::_scaled_dot_product_flash_attention"
_FLASH_BWD = "aten::_scaled_dot_product_flash_attention_backward"
_CPU_FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"
_CPU_FLASH_BWD = "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
_FA = "aten::_flash_attention_forward"
_FA_BWD = "aten::_flash_attention_backward"

_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_fallback(op: str, reason: str) -> None:
    with _warn_lock:
        if reason in _warned:
            return
        _warned.add(reason)
    warnings.warn(f"aotriton-rocm: {op} falls back to torch's kernel: {reason}",
                  stacklevel=3)


@functools.lru_cache(maxsize=None)
def _aux_outputs(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """RNG state, ``unused`` and debug mask, as torch's meta kernel shapes them
    for this build. Without dropout and without a debug mask nothing reads or
    writes them, so one unfilled set per device and dtype serves every call
    (allocating them costs more than the attention at small sizes)."""
    if torch.version.hip:
        seed = torch.empty((), dtype=torch.int64, device=device)
        offset = torch.empty((), dtype=torch.int64, device=device)
    else:
        seed = torch.empty((2,), dtype=torch.uint64, device=device)
        offset = torch.empty((), dtype=torch.uint64, device=device)
    return seed, offset, torch.empty(0, dtype=dtype, device=device)


class Unsupported(Exception):
    """Raised by the op functions below when our kernels don't cover a call;
    the message is the reason (the override falls back to torch's kernel)."""


def _fa_reason(query, key, value, cum_seq_q, cum_seq_k, dropout_p, return_debug_mask=False,
               **unsupported_kwargs) -> str | None:
    if cum_seq_q is not None or cum_seq_k is not None:
        return "variable-length batches (cum_seq_q/cum_seq_k) are not supported yet"
    for name, val in unsupported_kwargs.items():
        if val is not None:
            return f"{name} is not supported yet"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "query/key/value must be 4-D (batch, seqlen, heads, head_dim)"
    return attention.unsupported_reason(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
        dropout_p=dropout_p, return_debug_mask=return_debug_mask)


def flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
                            dropout_p, is_causal, return_debug_mask, *, scale=None,
                            window_size_left=None, window_size_right=None, seqused_k=None,
                            alibi_slopes=None, block_table=None, num_splits=None):
    """``aten::_flash_attention_forward`` on our kernels: (B, S, H, D) tensors,
    bottom-right causal, flash-attn's sliding window. Outputs are shaped as
    torch's meta kernel shapes them. Raises :class:`Unsupported`."""
    reason = _fa_reason(query, key, value, cum_seq_q, cum_seq_k, dropout_p, return_debug_mask,
                        seqused_k=seqused_k, alibi_slopes=alibi_slopes,
                        block_table=block_table, num_splits=num_splits)
    if reason:
        raise Unsupported(reason)
    window = attention.flash_attn_window(window_size_left, window_size_right, key.size(1))
    out = torch.empty_like(query)
    _, lse = attention.forward(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                               is_causal=is_causal, scale=scale, out=out.transpose(1, 2),
                               causal_alignment="bottom_right", window_size=window)
    seed, offset, debug = _aux_outputs(query.device, query.dtype)
    return out, lse, seed, offset, debug


def flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                             max_q, max_k, dropout_p, is_causal, rng_state, unused, *,
                             scale=None, window_size_left=None, window_size_right=None):
    """``aten::_flash_attention_backward`` on our kernels (see
    :func:`flash_attention_forward`); gradients are ``empty_like`` the inputs,
    as torch's meta kernel. Raises :class:`Unsupported`."""
    reason = _fa_reason(query, key, value, cum_seq_q, cum_seq_k, dropout_p)
    if reason:
        raise Unsupported(reason)
    window = attention.flash_attn_window(window_size_left, window_size_right, key.size(1))
    grads = tuple(torch.empty_like(t) for t in (query, key, value))
    attention.backward(grad_out.transpose(1, 2), query.transpose(1, 2), key.transpose(1, 2),
                       value.transpose(1, 2), out.transpose(1, 2), logsumexp,
                       is_causal=is_causal, scale=scale,
                       grads=tuple(g.transpose(1, 2) for g in grads),
                       causal_alignment="bottom_right", window_size=window)
    return grads


class _Overrides:
    """The kernels we put on the dispatcher; ``remove()`` gives torch's back."""

    def __init__(self, cpu: bool):
        self._lib = torch.library.Library("aten", "IMPL")
        self._orig = {}
        self._register(_FLASH, "CUDA", self._flash_fwd)
        self._register(_FLASH_BWD, "CUDA", self._flash_bwd)
        self._register(_FA, "CUDA", self._fa_fwd)
        self._register(_FA_BWD, "CUDA", self._fa_bwd)
        if cpu:
            self._register(_CPU_FLASH, "CPU", self._cpu_fwd)
            self._register(_CPU_FLASH_BWD, "CPU", self._cpu_bwd)

    def _register(self, op: str, key: str, fn) -> None:
        try:
            self._orig[op] = torch.library.get_kernel(op, key)
        except RuntimeError:
            return  # this torch build has no kernel there (a CPU-only build's CUDA key)
        with warnings.catch_warnings():
            # Overriding torch's kernel is the point; its one-time warning says so.
            warnings.filterwarnings("ignore",
                                    message="(?s).*Overriding a previously registered kernel")
            self._lib.impl(op.split("::")[1], fn, key, with_keyset=True)

    def remove(self) -> None:
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None

    def _fallback(self, op, keyset, reason, *args, **kwargs):
        _warn_fallback(op.split("::")[1], reason)
        return self._orig[op].call_boxed(keyset, *args, **kwargs)

    # aten::_scaled_dot_product_flash_attention
    def _flash_fwd(self, keyset, query, key, value, dropout_p=0.0, is_causal=False,
                   return_debug_mask=False, *, scale=None):
        reason = attention.unsupported_reason(query, key, value, dropout_p=dropout_p,
                                              is_causal=is_causal,
                                              return_debug_mask=return_debug_mask)
        if reason:
            return self._fallback(_FLASH, keyset, reason, query, key, value, dropout_p,
                                  is_causal, return_debug_mask, scale=scale)
        # On this op is_causal with seqlen_q != seqlen_k means bottom-right
        # (torch's causal_lower_right calls it so; F.sdpa's selector sends it
        # only square causal inputs).
        out, lse = attention.forward(query, key, value, is_causal=is_causal, scale=scale,
                                     causal_alignment="bottom_right")
        seed, offset, debug = _aux_outputs(query.device, query.dtype)
        return out, lse, None, None, query.size(2), key.size(2), seed, offset, debug

    # aten::_scaled_dot_product_flash_attention_backward
    def _flash_bwd(self, keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q,
                   cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset,
                   *, scale=None):
        reason = attention.unsupported_reason(query, key, value, dropout_p=dropout_p,
                                              is_causal=is_causal)
        if reason:
            return self._fallback(_FLASH_BWD, keyset, reason, grad_out, query, key, value, out,
                                  logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                                  is_causal, philox_seed, philox_offset, scale=scale)
        return attention.backward(grad_out, query, key, value, out, logsumexp,
                                  is_causal=is_causal, scale=scale,
                                  causal_alignment="bottom_right")

    # aten::_flash_attention_forward ((B, S, H, D); torch 2.13 adds block_table, num_splits)
    def _fa_fwd(self, keyset, *args, **kwargs):
        try:
            return flash_attention_forward(*args, **kwargs)
        except Unsupported as exc:
            return self._fallback(_FA, keyset, str(exc), *args, **kwargs)

    # aten::_flash_attention_backward
    def _fa_bwd(self, keyset, *args, **kwargs):
        try:
            return flash_attention_backward(*args, **kwargs)
        except Unsupported as exc:
            return self._fallback(_FA_BWD, keyset, str(exc), *args, **kwargs)

    # aten::_scaled_dot_product_flash_attention_for_cpu
    def _cpu_fwd(self, keyset, query, key, value, dropout_p=0.0, is_causal=False, *,
                 attn_mask=None, scale=None):
        reason = attention.unsupported_reason(query, key, value, dropout_p=dropout_p,
                                              is_causal=is_causal, attn_mask=attn_mask)
        if reason:
            return self._fallback(_CPU_FLASH, keyset, reason, query, key, value, dropout_p,
                                  is_causal, attn_mask=attn_mask, scale=scale)
        # torch's CPU flash op (like its math backend) aligns causal top-left.
        out, lse = attention.forward(query, key, value, is_causal=is_causal, scale=scale,
                                     causal_alignment="top_left")
        b, h, sq, _ = query.shape
        # torch's CPU kernel returns logsumexp as a (B, Sq, H) buffer viewed (B, H, Sq).
        lse_cpu = torch.empty((b, sq, h), dtype=torch.float32).transpose(1, 2)
        lse_cpu.copy_(lse)
        return out, lse_cpu

    # aten::_scaled_dot_product_flash_attention_for_cpu_backward
    def _cpu_bwd(self, keyset, grad_out, query, key, value, out, logsumexp, dropout_p,
                 is_causal, *, attn_mask=None, scale=None):
        reason = attention.unsupported_reason(query, key, value, dropout_p=dropout_p,
                                              is_causal=is_causal, attn_mask=attn_mask)
        if reason:
            return self._fallback(_CPU_FLASH_BWD, keyset, reason, grad_out, query, key, value,
                                  out, logsumexp, dropout_p, is_causal, attn_mask=attn_mask,
                                  scale=scale)
        # torch's CPU meta kernel lays gradients out as (B, S, H, D).
        grads = tuple(torch.empty_permuted(t.size(), (0, 2, 1, 3), dtype=t.dtype)
                      for t in (query, key, value))
        return attention.backward(grad_out, query, key, value, out, logsumexp,
                                  is_causal=is_causal, scale=scale, grads=grads,
                                  causal_alignment="top_left")


_active: _Overrides | None = None
_cpu_requested = False


def _cpu_wanted() -> bool:
    return _cpu_requested or os.environ.get(CPU_ENV, "") == "1"


def _register_fn() -> _Overrides:
    # Called by torch's registry on activation; also by enable() without it.
    global _active
    torch_compat.check_torch(torch.__version__)  # refuse an unsupported torch (clear message)
    if _active is not None:
        _active.remove()
    _active = _Overrides(cpu=_cpu_wanted())
    return _active


def has_registry() -> bool:
    return hasattr(torch.nn.attention, "register_flash_attention_impl")


def register() -> None:
    """Make ``IMPL_NAME`` known to torch's registry; activates nothing."""
    if has_registry():
        torch.nn.attention.register_flash_attention_impl(IMPL_NAME, register_fn=_register_fn)


def enable(cpu_interpreter: bool = False) -> None:
    """Route torch's flash attention through aotriton-rocm.

    ``cpu_interpreter=True`` also routes CPU tensors through the kernel sources
    run by Triton's interpreter (slow: for testing without a GPU).
    """
    global _cpu_requested
    torch_compat.check_torch(torch.__version__)  # UnsupportedTorchError names what to do
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
