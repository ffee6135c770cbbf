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

import os
import threading
import warnings

import torch

from ..common.trace import span
from ..core.device import gpu_available
from ..core.registry import IMPL_NAME, has_registry
from ..core.registry import register as _registry_register
from ..core.torch_compat import check_torch
from ..core.torch_native import OURS as TORCH_NATIVE_OURS
from ..core.torch_native import (activate as activate_torch_native,
                                 process_archives as torch_native_archives,
                                 wanted as torch_native_wanted)
from .aten_ops import (Unsupported, _aux_outputs, _cpu_reason, _flash_rng_outputs, _note_torch_philox,
                       _rng_inputs, _rng_layout, _route, efficient_attention_backward,
                       efficient_attention_forward, fill_mem_eff_dropout_mask,
                       flash_attention_backward, flash_attention_forward)


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
        python_kernels.update({op: _our_python_route(op) for op in TORCH_NATIVE_OURS})
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


def _our_python_route(op: str):
    """The Python route of our operator ``op``, flash_attn_ops loaded on its
    first call (enable() on the C++ route never needs it)."""
    def kernel(keyset, *args):
        from .flash_attn_ops import PYTHON_ROUTES

        return PYTHON_ROUTES[op](keyset, *args)
    return kernel


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
