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


class _Overrides:
    """The kernels we put on the dispatcher; ``remove()`` gives torch's back."""

    def __init__(self, cpu: bool):
        self._lib = torch.library.Library("aten", "IMPL")
        self._orig = {}
        self._register(_FLASH, "CUDA", self._flash_fwd)
        self._register(_FLASH_BWD, "CUDA", self._flash_bwd)
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
