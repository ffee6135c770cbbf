"""flash-attn's attention as torch operators: ``torch.ops.aotriton_rocm.
flash_attn_forward`` and ``flash_attn_backward``, which
:func:`~aotriton_rocm.flash_attn_func`, :func:`~aotriton_rocm.
flash_attn_varlen_func` and their packed forms call, and
``flash_attn_kvcache``, the attention of :func:`~aotriton_rocm.
flash_attn_with_kvcache` (and of the varlen function's paged caches).

As operators (defined with ``torch.library``, as flash-attn defines its own),
each call is one node to torch.compile: fake kernels give its outputs'
shapes, so Dynamo never traces into the launch (our ctypes structures), and
autograd reaches the backward operator through ``register_autograd``. Each
operator checks its call when it runs, as the eager functions always did.
They are defined with ``Library.define``/``impl`` rather than
``torch.library.custom_op``, whose per-call wrapping costs about 80 us of host
time (measured on this project's CPU host: 94 against 9 us per call).

q, k, v are flash-attn's: (batch, seqlen, heads, head_dim), or packed
(total, heads, head_dim) with ``cu_seqlens_q/k``.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from ..common.operator_schemas import FLASH_ATTN_BACKWARD, FLASH_ATTN_FORWARD, FLASH_ATTN_KVCACHE
from ..core.attention import MAX_HEAD_DIM, Varlen, new_rng_state, problem_dims
from ..core.attention import backward as attention_backward, forward as attention_forward
from ..core.attention import unsupported_reason as attention_unsupported_reason, varlen_rows
from ..core.kvcache import forward as kvcache_forward
from ..core.native import NativeError, refusal
from ..core.philox_state import efficient_dims
from ..core.torch_native import (activate as activate_torch_native, is_active as torch_native_active,
                                 process_archives as torch_native_archives,
                                 wanted as torch_native_wanted)

__all__ = ["KVCACHE_SUPPORTED", "PYTHON_ROUTES", "SUPPORTED", "check_operands", "fail", "refuse",
           "schema_refused",
           "flash_attn_backward", "flash_attn_forward", "flash_attn_kvcache", "forward",
           "forward_state", "refusal_kept"]

_DTYPES = "fp16/bf16/fp32"
SUPPORTED = (f"{_DTYPES} tensors, head dims 1 to {MAX_HEAD_DIM} (fp32: 256), nheads a "
             "multiple of nheads_k (GQA/MQA), "
             "softmax_scale, causal, window_size, softcap >= 0, alibi_slopes (float32, "
             "(nheads,) or (batch, nheads)), 0 <= dropout_p < 1, return_attn_probs; "
             "block_table (paged k/v, no dropout, no backward) in flash_attn_varlen_func")


KVCACHE_SUPPORTED = ("fp16/bf16 tensors, headdim 1 to 256, nheads a multiple of "
                     "nheads_k, dense caches (cache_batch_idx, cache_leftpad) or paged ones "
                     "(block_table, page sizes that are multiples of 16), k/v appended in "
                     "place, rotary_cos/rotary_sin (interleaved or not), causal, window_size, "
                     "softcap, alibi_slopes, num_splits, return_softmax_lse")


def fail(api: str, reason: str):
    supported = KVCACHE_SUPPORTED if api == "flash_attn_with_kvcache" else SUPPORTED
    raise ValueError(f"aotriton_rocm.{api}: {reason} (supported: {supported})")


# flash_attn_with_kvcache's names of what the library calls k_end and k_start
_KVCACHE_NAMES = {"k_end": "cache_seqlens", "k_start": "cache_leftpad"}


def refuse(api: str, exc: NativeError):
    """libaotriton_rocm's refusal of a call as the API's error (its reason,
    in the library's words, with the API's argument names); any other failure
    as it came."""
    reason = refusal(exc)
    if reason is None:
        raise exc
    if api == "flash_attn_with_kvcache":
        reason = re.sub(r"\b(k_end|k_start)\b", lambda m: _KVCACHE_NAMES[m.group(1)], reason)
    fail(api, reason)


def schema_refused(exc: Exception) -> bool:
    """Whether an operator call failed only because its schema does not take
    a scalar as it was given (the front ends then convert and check it)."""
    return isinstance(exc, TypeError) or "Expected a value of type" in str(exc)


def check_operands(api: str, q: Tensor, **tensors) -> None:
    """What an operator's dispatch needs before it runs: tensors, on q's
    device (a tensor elsewhere, e.g. on "meta", would pick another kernel)."""
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            fail(api, f"{name} must be a tensor, got {type(t).__name__}")
        if t.device != q.device:
            fail(api, f"{name} must be on the query's device ({q.device}), not {t.device}")


def forward_state(q: Tensor, k: Tensor, varlen: Varlen | None, dropout_p: float,
                  return_debug_mask: bool) -> tuple[Tensor | None, Tensor | None]:
    """The forward's Philox state (None without dropout or a debug mask) and
    its zeroed debug mask (None unless asked for)."""
    state = None
    if dropout_p:
        # One counter per score, as torch's efficient kernel advances the
        # generator: the kernels draw that many.
        b, h, _, sq, sk, _ = problem_dims(q, k, varlen)
        state = new_rng_state(q.device, efficient_dims(b, h, sq, sk))
    elif return_debug_mask:
        # Nothing is dropped at p = 0: any state gives the same mask, so
        # leave torch's generator alone.
        state = torch.zeros(2, dtype=torch.int64, device=q.device)
    debug = None
    if return_debug_mask:
        b, h, _, sq, sk, _ = problem_dims(q, k, varlen)
        # Zeroed: the kernel writes only the key blocks a row visits.
        debug = torch.zeros((b, h, sq, sk), dtype=q.dtype, device=q.device)
    return state, debug


@dataclass
class _Call:
    """One call in the kernels' terms: q, k, v as (B, H, S, D) views or the
    packed rows its offsets cover, its Varlen and its window (flash-attn's
    sizes as given: the C core's rule applies when it runs)."""

    api: str  # the flash-attn function named in refusals
    q: Tensor
    k: Tensor
    v: Tensor
    varlen: Varlen | None
    window: tuple[int, int]
    total_q: int  # packed rows of the caller's q (0 for dense calls)
    total_k: int

    @classmethod
    def of(cls, q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, causal, window_left,
           window_right, alibi_slopes, return_debug_mask) -> "_Call":
        api = "flash_attn_func" if cu_q is None else "flash_attn_varlen_func"
        check_operands(api, q, alibi_slopes=alibi_slopes)
        if cu_q is None:
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            reason = attention_unsupported_reason(
                qt, kt, vt, dropout_p=dropout_p, is_causal=causal,
                return_debug_mask=return_debug_mask)
            if reason:
                fail(api, reason)
            return cls(api, qt, kt, vt, None, (window_left, window_right), 0, 0)
        varlen = Varlen(cu_q, cu_k, max_q, max_k)
        reason = attention_unsupported_reason(
            q, k, v, dropout_p=dropout_p, is_causal=causal, varlen=varlen,
            return_debug_mask=return_debug_mask)
        if reason:
            fail(api, reason)
        try:
            ends = varlen_rows(q, k, v, varlen)
        except NativeError as exc:
            refuse(api, exc)
        total_q, total_k = q.shape[0], k.shape[0]
        if ends is not None:
            # Rows past the last offset belong to no sequence: the kernels
            # never touch them, so run on the rows that do (slices: no copy);
            # their output and gradients are zeros.
            q, k, v = q[:ends[0]], k[:ends[1]], v[:ends[1]]
        return cls(api, q, k, v, varlen, (window_left, window_right), total_q, total_k)

    def rows_q(self, t: Tensor) -> Tensor:
        """A tensor of the caller's query rows in the kernels' terms."""
        return t.transpose(1, 2) if self.varlen is None else t[:self.q.shape[0]]

    def lse_in(self, lse: Tensor) -> Tensor:
        return lse if self.varlen is None else lse[:, :self.q.shape[0]]

    def padded(self, t: Tensor, total: int, value: float = 0.0, dim: int = 0) -> Tensor:
        """A varlen result back at the caller's row count (value past the rows run)."""
        missing = total - t.shape[dim]
        if self.varlen is None or missing <= 0:
            return t
        pad = [0, 0] * (t.dim() - 1 - dim) + [0, missing]
        return torch.nn.functional.pad(t, pad, value=value)


_LIB = torch.library.Library("aotriton_rocm", "DEF")  # alive as long as the process
for _schema in (FLASH_ATTN_FORWARD, FLASH_ATTN_BACKWARD, FLASH_ATTN_KVCACHE):
    _LIB.define(_schema)


def forward_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                  softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                  return_debug_mask, deterministic):
    """(out, softmax_lse, rng_state, debug_mask): out like q with v's head
    dim; lse (batch, heads, seqlen_q), packed (heads, total_q); the Philox
    (seed, offset) the backward replays (empty without dropout or a debug
    mask); the
    kernels' debug mask (see ``AttentionFunction``) or an empty (0,) tensor.
    ``deterministic`` is the backward's."""
    call = _Call.of(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                    causal, window_left, window_right, alibi_slopes, return_debug_mask)
    state, debug = forward_state(call.q, call.k, call.varlen, dropout_p, return_debug_mask)
    try:
        out, lse = attention_forward(
            call.q, call.k, call.v, is_causal=causal, scale=softmax_scale,
            causal_alignment="bottom_right", window_size=call.window, dropout_p=dropout_p,
            rng=None if state is None else (state[0], state[1]), debug_mask=debug,
            varlen=call.varlen, softcap=softcap, alibi_slopes=alibi_slopes)
    except NativeError as exc:
        refuse(call.api, exc)
    if call.varlen is None:
        out = out.transpose(1, 2)
    out = call.padded(out, call.total_q)
    lse = call.padded(lse, call.total_q, float("inf"), dim=1)
    if state is None:  # the backward reads it only with dropout
        state = torch.empty((0,), dtype=torch.int64, device=q.device)
    if debug is None:
        debug = torch.empty((0,), dtype=q.dtype, device=q.device)
    return out, lse, state, debug


@torch.library.register_fake("aotriton_rocm::flash_attn_forward")
def _forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                  softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                  return_debug_mask, deterministic):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    if cu_seqlens_q is None:
        b, sq, h = q.shape[0], q.shape[1], q.shape[2]
        sk = k.shape[1]
        lse = q.new_empty((b, h, sq), dtype=torch.float32)
    else:
        b, h = cu_seqlens_q.shape[0] - 1, q.shape[1]
        sq, sk = max_seqlen_q, max_seqlen_k
        lse = q.new_empty((h, q.shape[0]), dtype=torch.float32)
    debug = q.new_empty((b, h, sq, sk) if return_debug_mask else (0,))
    state = q.new_empty((2,) if dropout_p or return_debug_mask else (0,), dtype=torch.int64)
    return out, lse, state, debug


def _backward_impl(grad_out, q, k, v, out, softmax_lse, rng_state, cu_seqlens_q, cu_seqlens_k,
                   max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_left,
                   window_right, softcap, alibi_slopes, deterministic):
    """(dq, dk, dv) of :func:`flash_attn_forward`'s out."""
    call = _Call.of(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                    causal, window_left, window_right, alibi_slopes, False)
    try:
        dq, dk, dv = attention_backward(
            call.rows_q(grad_out), call.q, call.k, call.v, call.rows_q(out),
            call.lse_in(softmax_lse), is_causal=causal, scale=softmax_scale,
            causal_alignment="bottom_right", window_size=call.window, dropout_p=dropout_p,
            rng=(rng_state[0], rng_state[1]) if dropout_p else None, varlen=call.varlen,
            softcap=softcap, alibi_slopes=alibi_slopes, deterministic=deterministic)
    except NativeError as exc:
        refuse(call.api, exc)
    if call.varlen is None:
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
    return (call.padded(dq, call.total_q), call.padded(dk, call.total_k),
            call.padded(dv, call.total_k))


@torch.library.register_fake("aotriton_rocm::flash_attn_backward")
def _backward_fake(grad_out, q, k, v, out, softmax_lse, rng_state, cu_seqlens_q, cu_seqlens_k,
                   max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_left,
                   window_right, softcap, alibi_slopes, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# flash_attn_forward's scalar arguments the backward takes (after cu_seqlens_q/k)
_SCALARS = ("max_seqlen_q", "max_seqlen_k", "dropout_p", "softmax_scale", "causal",
            "window_left", "window_right", "softcap")


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, *rest = inputs
    out, lse, state, debug = output
    scalars, (alibi, _return_debug_mask, deterministic) = rest[:len(_SCALARS)], rest[len(_SCALARS):]
    ctx.save_for_backward(q, k, v, out, lse, state, cu_q, cu_k, alibi)
    ctx.scalars = dict(zip(_SCALARS, scalars))
    ctx.deterministic = deterministic
    ctx.mark_non_differentiable(lse, state, debug)


def _backward(ctx, grad_out, _grad_lse, _grad_state, _grad_debug):
    q, k, v, out, lse, state, cu_q, cu_k, alibi = ctx.saved_tensors
    s = ctx.scalars
    dq, dk, dv = flash_attn_backward(
        grad_out.contiguous() if grad_out.stride(-1) != 1 else grad_out, q, k, v, out, lse, state,
        cu_q, cu_k, s["max_seqlen_q"], s["max_seqlen_k"], s["dropout_p"], s["softmax_scale"],
        s["causal"], s["window_left"], s["window_right"], s["softcap"], alibi,
        # torch's deterministic mode asks for it too (the C++ kernel cannot see it)
        ctx.deterministic or torch.are_deterministic_algorithms_enabled())
    return (dq, dk, dv) + (None,) * 13


def _kvcache_impl(q, k_cache, v_cache, k_end, k_start, cache_batch_idx, block_table, alibi_slopes,
                  softmax_scale, causal, window_left, window_right, softcap, num_splits,
                  cu_seqlens_q, max_seqlen_q, api):
    """(out, softmax_lse) of queries against KV caches (see
    :func:`aotriton_rocm.core.kvcache.forward`; the window is flash-attn's,
    as given). Inference only: no autograd. ``api`` names the caller in
    refusals."""
    check_operands(api, q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=k_end,
                   cache_leftpad=k_start, cache_batch_idx=cache_batch_idx, block_table=block_table,
                   alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q)
    try:
        out, lse, _ = kvcache_forward(
            q, k_cache, v_cache, k_end, k_start=k_start, cache_batch_idx=cache_batch_idx,
            block_table=block_table, alibi_slopes=alibi_slopes, scale=softmax_scale,
            causal=causal, window_size=(window_left, window_right), softcap=softcap,
            num_splits=num_splits, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q)
    except NativeError as exc:
        refuse(api, exc)
    return out, lse


@torch.library.register_fake("aotriton_rocm::flash_attn_kvcache")
def _kvcache_fake(q, k_cache, v_cache, k_end, k_start, cache_batch_idx, block_table, alibi_slopes,
                  softmax_scale, causal, window_left, window_right, softcap, num_splits,
                  cu_seqlens_q, max_seqlen_q, api):
    out = q.new_empty((*q.shape[:-1], v_cache.shape[-1]))
    if cu_seqlens_q is None:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return out, lse


_IMPLS = {"flash_attn_forward": forward_impl, "flash_attn_backward": _backward_impl,
          "flash_attn_kvcache": _kvcache_impl}
# The Python route of each operator, for the C++ kernels' fallback
# (aotriton_rocm::py_<op>, see torch_native.activate).
PYTHON_ROUTES = {name: (lambda impl: lambda _keyset, *args: impl(*args))(impl)
                 for name, impl in _IMPLS.items()}
_native_failed = False


def _served_natively(q: Tensor) -> bool:
    """On a GPU call while no C++ kernel serves our operators (first call,
    or after ``disable()``): put them on torch_native's C++ kernels (torch
    >= 2.10 with the extension installed); True when the operator should
    be called again to reach them. A failure is warned about once, and the
    Python route keeps every call."""
    global _native_failed
    if _native_failed or not q.is_cuda or torch_native_active():
        return False
    if not torch_native_wanted():  # torch < 2.10, no extension, or turned off: asked once
        _native_failed = True
        return False
    try:
        activate_torch_native(PYTHON_ROUTES, aten=False, archives=torch_native_archives())
    except (OSError, RuntimeError) as exc:
        _native_failed = True
        warnings.warn(f"aotriton-rocm: the C++ route of flash-attn's operators is unavailable "
                      f"({exc}); using the Python route", stacklevel=3)
        return False
    return True


def _dispatched(name: str, op):
    impl = _IMPLS[name]

    def kernel(*args):
        if _served_natively(args[1] if name == "flash_attn_backward" else args[0]):
            return op(*args)
        return impl(*args)
    return kernel


for _name in _IMPLS:
    _LIB.impl(_name, _dispatched(_name, getattr(torch.ops.aotriton_rocm, _name).default),
              "CompositeExplicitAutograd")
torch.library.register_autograd("aotriton_rocm::flash_attn_forward", _backward,
                                setup_context=_setup_context)

flash_attn_forward = torch.ops.aotriton_rocm.flash_attn_forward.default
flash_attn_backward = torch.ops.aotriton_rocm.flash_attn_backward.default
flash_attn_kvcache = torch.ops.aotriton_rocm.flash_attn_kvcache.default


def forward(q: Tensor, k: Tensor, v: Tensor, *args):
    """:data:`flash_attn_forward`, past its autograd kernel where no gradient
    can flow (grad mode off, or q, k and v need none): that kernel, Python
    in torch.library, costs about 40 us a call on the H200 host. torch.compile
    traces the operator itself."""
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or v.requires_grad)):
        return refusal_kept(flash_attn_forward, q, k, v, *args)
    with torch._C._AutoDispatchBelowAutograd():
        return refusal_kept(flash_attn_forward, q, k, v, *args)


def refusal_kept(op, *args):
    """``op(*args)``; where its C++ kernel handed the call to the Python
    route and that raised (a refusal: no exception type crosses torch's
    stable ABI, it arrives as "py_<op> failed"), the Python route's own
    exception, with its reason, raised here."""
    try:
        return op(*args)
    except RuntimeError as exc:
        name = op.name().split("::")[-1].split(".")[0]
        if torch.compiler.is_compiling() or f"::py_{name} failed" not in str(exc):
            raise
        _IMPLS[name](*args)
        raise
