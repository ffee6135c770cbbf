"""FlashAttention forward and backward through our kernels.

The Python routes into torch end here. It asks whether the request is
covered (returning the reason when it is not, so the caller can fall back
to torch's own kernel), prepares tensors so they meet the specialization
assumptions the kernels were compiled with, allocates outputs, and hands
the call to the backend of the tensors' device, where libaotriton_rocm
plans and launches it: the AOT archive on a GPU, Triton's interpreter on
the CPU.

Dense inputs are (B, H, S, D). Variable-length batches (:class:`Varlen`) are
packed (total, H, D) tensors whose sequences start at ``cu_seqlens``.
Features: causal (either alignment), sliding window, GQA/MQA, an additive
attention bias broadcast over batch/heads/rows (with its gradient), dropout
(Philox, regenerated in the backward from the same seed/offset tensors), the
dropout debug mask, flash-attn's softcap and ALiBi (runtime arguments of
the same kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .backends import Backend, backend_for
from .native import OK as NATIVE_OK, attn_window, default_scale, dtype_code, error as native_error
from .native import library as native_library, make_problem
from .philox_state import next_state

# Head dims covered: 1 to this. The kernels take multiples of 8 (padded to a
# power of two >= 16 inside them, never in memory); libaotriton_rocm runs any
# other head dim on copies zero-padded to the next multiple of 8.
MAX_HEAD_DIM = 512
# torch's CUDA flash op (and flash-attn) align a causal mask to the bottom
# right when seqlen_q != seqlen_k; torch's math backend and CPU flash op to the
# top left. Both agree when seqlen_q == seqlen_k.
CAUSAL_ALIGNMENTS = ("bottom_right", "top_left")

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@dataclass(frozen=True)
class Varlen:
    """A packed batch: sequence b holds rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``
    of q (and likewise for k/v); int32 tensors of batch + 1 offsets."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    #: sequences that do not lie end to end (aotr_attn_fwd_params): int32
    #: (batch,) vectors of where each sequence starts in q / in k and v
    #: (Transformer Engine's cu_seqlens_padded), and of each sequence's
    #: number of keys (flash-attn's seqused_k); None: from cu_seqlens.
    seq_starts_q: torch.Tensor | None = None
    seq_starts_k: torch.Tensor | None = None
    seqlens_k: torch.Tensor | None = None

    @property
    def batch(self) -> int:
        return self.cu_seqlens_q.numel() - 1


def problem_dims(q: torch.Tensor, k: torch.Tensor, varlen: Varlen | None):
    """(batch, heads, heads_k, seqlen_q, seqlen_k, head_dim); max seqlens for varlen."""
    if varlen is None:
        b, h, sq, d = q.shape
        return b, h, k.shape[1], sq, k.shape[2], d
    return varlen.batch, q.shape[1], k.shape[1], varlen.max_seqlen_q, varlen.max_seqlen_k, q.shape[2]


def unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                       dropout_p: float = 0.0, is_causal: bool = False,
                       attn_mask=None, return_debug_mask: bool = False,
                       varlen: Varlen | None = None) -> str | None:
    """Why our kernels cannot compute this attention, or None if they can.

    The rules of shapes, dtypes, heads, head dims, dropout and 32-bit limits
    are libaotriton_rocm's (``aotr_attn_check``, asked here with the tensors'
    views: it reads no data); what is torch's (devices, masks, tensors'
    types) and the backend's images are checked here.

    ``attn_mask`` is an additive float mask of q's dtype (or a boolean mask)
    broadcastable to (B, H, Sq, Sk). flash-attn's ``softcap`` and
    ``alibi_slopes`` are judged by the forward call itself (NativeError,
    nothing launched).
    """
    rank = 4 if varlen is None else 3
    layout = "(batch, heads, seqlen, head_dim)" if varlen is None else "(total, heads, head_dim)"
    if q.dim() != rank or k.dim() != rank or v.dim() != rank:
        return f"query/key/value must be {rank}-D {layout}"
    dtype = q.dtype
    if k.device != q.device or v.device != q.device:
        return "query, key and value must be on one device"
    if varlen is not None:
        reason = _varlen_reason(varlen, q, k)
        if reason:
            return reason
        if attn_mask is not None:
            return "an attn_mask with a variable-length batch is not covered"
    reason = _core_reason(q, k, v, is_causal, dropout_p, varlen)
    if reason:
        return reason
    if k.shape != v.shape:  # the Python route's kernels read one head dim
        return "key and value must have one shape, and query their head_dim"
    b, h, _, sq, sk, d = problem_dims(q, k, varlen)
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool and attn_mask.dtype != dtype:
            return f"attn_mask dtype {attn_mask.dtype} must be bool or the query's ({dtype})"
        if attn_mask.device != q.device:
            return "attn_mask must be on the query's device"
        try:
            torch.broadcast_shapes(attn_mask.shape, (b, h, sq, sk))
        except RuntimeError:
            return f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to {(b, h, sq, sk)}"
    backend = backend_for(q)
    if backend is None:
        return f"no backend for device {q.device}"
    return backend.unsupported_reason(dtype=DTYPE_NAMES[dtype],
                                      head_dim=d,
                                      bias=attn_mask is not None,
                                      dropout=bool(dropout_p) or return_debug_mask,
                                      work=b * h * sq * sk * d)


def _core_reason(q, k, v, is_causal, dropout_p, varlen) -> str | None:
    """libaotriton_rocm's verdict on the request (``aotr_attn_check``)."""
    # a dtype the library has no code for is named here, in its words
    if dtype_code(q.dtype) == 0:
        return f"dtype {str(q.dtype).replace('torch.', '')} is not covered (fp16, bf16 and fp32 are)"
    cu = None if varlen is None else (varlen.cu_seqlens_q, varlen.cu_seqlens_k)
    seqlens = (0, 0) if varlen is None else (varlen.max_seqlen_q, varlen.max_seqlen_k)
    problem = make_problem(q, k, v, scale=1.0, causal=is_causal, dropout_p=dropout_p,
                                  cu_seqlens=cu, max_seqlens=seqlens)
    status = native_library().aotr_attn_check(problem)
    return None if status == NATIVE_OK else native_error(status).message


def _varlen_reason(varlen: Varlen, q: torch.Tensor, k: torch.Tensor) -> str | None:
    """torch's half of the offsets' rules (their devices); the C core checks
    the rest (dtype, rank, lengths, row counts)."""
    for name, cu in (("cu_seqlens_q", varlen.cu_seqlens_q), ("cu_seqlens_k", varlen.cu_seqlens_k)):
        if cu.device != q.device:
            return f"{name} must be on the query's device"
    return None


def varlen_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                varlen: Varlen) -> tuple[int, int] | None:
    """The packed rows of q and k that ``varlen``'s offsets cover, checked
    on the host by libaotriton_rocm (NativeError names a broken rule: start
    at 0, non-decreasing, within the rows, no longer than max_seqlen); None
    during a graph capture, where nothing is read. A request
    :func:`unsupported_reason` passed."""
    return backend_for(q).varlen_rows(q, k, v, varlen)


def meets_assumptions(t: torch.Tensor) -> bool:
    """Unit last-dim stride, 16-byte-aligned base, other strides divisible by 16."""
    *outer, last = t.stride()
    bits = t.data_ptr()
    for s in outer:
        bits |= s
    return last == 1 and not bits & 15


def prepared(t: torch.Tensor) -> torch.Tensor:
    """t itself if the kernels can read it in place, else a dense copy.

    Kernels are compiled assuming unit last-dim stride, 16-byte-aligned base
    addresses and strides divisible by 16 (elements); a contiguous copy meets
    them when the head dim is a multiple of 16, else :func:`_fresh` lays the
    rows out 16 elements apart.
    """
    if meets_assumptions(t):
        return t
    dense = t.contiguous()
    # contiguous() keeps odd strides of size-1 dims; a fresh tensor has none.
    return dense if meets_assumptions(dense) else fresh_like(t).copy_(t)


def fresh_like(t: torch.Tensor, device=None) -> torch.Tensor:
    """An uninitialised tensor shaped like t that meets the kernels'
    assumptions: its rows are padded to a multiple of 16 elements (our own
    allocation; the kernels never touch the padding). On t's device unless
    ``device`` says otherwise."""
    d = t.shape[-1]
    padded = -(-d // 16) * 16
    return torch.empty((*t.shape[:-1], padded), dtype=t.dtype,
                       device=t.device if device is None else device)[..., :d]


def _bias_prepared(mask: torch.Tensor, shape: tuple[int, int, int, int],
                   dtype: torch.dtype) -> torch.Tensor:
    """The additive bias as a (B, H, Sq, Sk) view the kernels can read: a
    boolean mask becomes 0 / -inf; broadcast dims keep stride 0 (never
    materialised), the key dim gets unit stride."""
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            ~mask, float("-inf"))
    full = mask.expand(shape)
    if meets_assumptions(full):
        return full
    # The smallest tensor that expands to `shape`: size 1 wherever the view broadcasts.
    base = [1 if n > 1 and s == 0 else n for n, s in zip(full.shape[:3], full.stride()[:3])]
    compact = full[tuple(slice(0, n) for n in base)]
    return fresh_like(compact).copy_(compact).expand(shape)


def _view4(t: torch.Tensor, varlen: Varlen | None) -> torch.Tensor:
    """(B, H, S, D) tensors as they are; packed (total, H, D) ones as (1, H, total, D)."""
    return t if varlen is None else t.unsqueeze(0).transpose(1, 2)


def _unview4(t: torch.Tensor, varlen: Varlen | None) -> torch.Tensor:
    """The inverse of :func:`_view4`."""
    return t if varlen is None else t[0].transpose(0, 1)


def new_rng_state(device: torch.device, dims: tuple[int, int, int, int] = (1, 1, 1, 4)
                  ) -> torch.Tensor:
    """The Philox (seed, offset) of a dropout call, a (2,) int64 tensor on
    ``device``: torch's generator's seed and offset, the offset then advanced
    by ``prod(dims)`` rounded up to a multiple of 4 (see
    :mod:`aotriton_rocm.philox_state`: ``flash_dims``, ``efficient_dims``).
    ``torch.manual_seed(s)`` makes the next call's state (s, 0); under
    CUDA-graph capture every replay gets the replay's state.
    """
    return next_state(device, dims)


def _bottom_right(causal_alignment: str) -> bool:
    if causal_alignment not in CAUSAL_ALIGNMENTS:
        raise ValueError(f"causal_alignment must be one of {CAUSAL_ALIGNMENTS}, "
                         f"got {causal_alignment!r}")
    return causal_alignment == "bottom_right"


def mask_args(is_causal: bool, seqlen_q: int, seqlen_k: int,
              causal_alignment: str = "bottom_right",
              window_size: tuple[int, int] = (-1, -1)) -> tuple[int, int, int]:
    """The kernels' ``(bottom_right, window_left, window_right)``.

    Key j is visible from query i iff ``i + shift - left <= j <= i + shift +
    right`` with ``shift = seqlen_k - seqlen_q`` (bottom-right) or 0
    (top-left), the sides as :func:`native.attn_window` gives them
    (flash-attn's ``window_size`` rule; causal is ``right = 0``).
    """
    left, right = attn_window(*window_size, is_causal, seqlen_k)
    return int(_bottom_right(causal_alignment)), left, right


def flash_attn_window(window_size_left, window_size_right, seqlen_k: int) -> tuple[int, int]:
    """flash-attn's window as the kernels run it (:func:`native.attn_window`
    without causal): None, a negative size or one >= seqlen_k is unbounded."""
    return attn_window(window_size_left, window_size_right, False, seqlen_k)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
            scale: float | None = None, out: torch.Tensor | None = None,
            causal_alignment: str = "bottom_right",
            window_size: tuple[int, int] = (-1, -1), bias: torch.Tensor | None = None,
            dropout_p: float = 0.0, rng: tuple[torch.Tensor, torch.Tensor] | None = None,
            debug_mask: torch.Tensor | None = None, varlen: Varlen | None = None,
            lse: torch.Tensor | None = None, softcap: float = 0.0,
            alibi_slopes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output (like ``out`` or ``empty_like(q)``) and the fp32 logsumexp.

    k and v may have fewer heads than q (GQA/MQA: query head h reads key/value
    head h // (Hq // Hkv)). With ``is_causal`` and seqlen_q != seqlen_k the mask
    is aligned as ``causal_alignment`` says; query rows that see no key
    (bottom-right, seqlen_q > seqlen_k) get output 0 and logsumexp +inf.
    ``window_size = (left, right)`` restricts row i to keys
    ``i + shift - left .. i + shift + right`` (see :func:`mask_args`; -1:
    unbounded); rows whose window holds no key get output 0 too.

    ``bias``: additive (or boolean) mask broadcastable to (B, H, Sq, Sk).
    ``dropout_p`` > 0 (or a ``debug_mask`` to fill) needs ``rng``: two
    0-dim int64 tensors, the Philox seed and offset (:func:`new_rng_state`);
    the backward must get the same ones. ``debug_mask``, a contiguous (B, H,
    Sq, Sk) tensor of q's dtype, receives each score's unnormalised
    probability, negated where dropout dropped it. The logsumexp is (B, H, Sq)
    (or the given ``lse``, (B, H, >= Sq)); with ``varlen`` it is (H, total_q).

    flash-attn's score modifications: ``softcap > 0`` replaces each scaled
    score s by ``softcap * tanh(s / softcap)``; ``alibi_slopes`` (fp32, (H,)
    or (B, H), no gradient) then adds ``-slope * |i + Sk - Sq - j|`` (per
    sequence with ``varlen``; bottom-right aligned whatever
    ``causal_alignment`` says), before ``bias`` and the masks; the
    logsumexp is that of the modified scores. The backward must get the
    same ``softcap`` and ``alibi_slopes``.
    The caller has checked :func:`unsupported_reason`.
    """
    backend: Backend = backend_for(q)
    b, h, hk, sq, sk, d = problem_dims(q, k, varlen)
    if out is None:
        out = torch.empty_like(q)
    if lse is None:
        lse_shape = (b, h, sq) if varlen is None else (h, q.shape[0])
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        lse.fill_(float("inf"))
        return out, lse
    bottom_right = _bottom_right(causal_alignment)
    sm_scale = default_scale(d) if scale is None else float(scale)
    q4, k4, v4 = (prepared(_view4(t, varlen)) for t in (q, k, v))
    o4 = _view4(out, varlen)
    o = o4 if meets_assumptions(o4) else fresh_like(o4)
    bias4 = None if bias is None else _bias_prepared(bias, (b, h, sq, sk), q.dtype)
    backend.forward(*(_unview4(t, varlen) for t in (q4, k4, v4, o)), lse, bias=bias4,
                    debug_mask=debug_mask, rng=rng, varlen=varlen,
                    causal=is_causal, bottom_right=bottom_right, window=window_size, scale=sm_scale,
                    dropout_p=float(dropout_p), softcap=float(softcap),
                    alibi_slopes=alibi_slopes)
    if o is not o4:
        o4.copy_(o)
    return out, lse


def new_bias_grad(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed bias-gradient buffer, laid out as torch's efficient-attention
    meta kernel lays it out (last dim padded to a multiple of 16)."""
    *outer, last = shape
    return torch.zeros((*outer, -(-last // 16) * 16), dtype=dtype, device=device)[..., :last]


def backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, *, is_causal: bool = False,
             scale: float | None = None,
             grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
             causal_alignment: str = "bottom_right",
             window_size: tuple[int, int] = (-1, -1), bias: torch.Tensor | None = None,
             bias_grad: torch.Tensor | None = None, dropout_p: float = 0.0,
             rng: tuple[torch.Tensor, torch.Tensor] | None = None,
             varlen: Varlen | None = None, softcap: float = 0.0,
             alibi_slopes: torch.Tensor | None = None, deterministic: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (written into ``grads`` if given, else like q, k, v).

    ``bias_grad`` (a (B, H, Sq, Sk) view, e.g. :func:`new_bias_grad`)
    receives the gradient of the bias; ``rng``, ``softcap`` and
    ``alibi_slopes`` must be the forward's.
    With GQA each dK/dV block is summed over its query heads by one program,
    without atomics. dQ too, but where the GPU's image has the fused backward
    for the problem (sm_90): there dQ is summed with atomics, in an order
    that varies from run to run, unless ``deterministic`` or torch's
    ``use_deterministic_algorithms(True)`` asks for the split kernels.
    """
    backend: Backend = backend_for(q)
    b, h, hk, sq, sk, d = problem_dims(q, k, varlen)
    if grads is None:
        grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    if bias_grad is not None:
        bias_grad.zero_()
    if q.numel() == 0 or k.numel() == 0:
        for g in grads:
            g.zero_()
        return grads
    bottom_right = _bottom_right(causal_alignment)
    sm_scale = default_scale(d) if scale is None else float(scale)
    q4, k4, v4, o4, do4 = (prepared(_view4(t, varlen)) for t in (q, k, v, out, grad_out))
    # the kernels read Delta with the logsumexp's strides
    lse = lse.contiguous()
    delta = torch.empty_like(lse)
    g4 = tuple(_view4(g, varlen) for g in grads)
    dq, dk, dv = (g if meets_assumptions(g) else fresh_like(g) for g in g4)
    bias4 = None if bias is None else _bias_prepared(bias, (b, h, sq, sk), q.dtype)
    backend.backward(*(_unview4(t, varlen) for t in (do4, q4, k4, v4, o4)), lse, delta,
                     tuple(_unview4(t, varlen) for t in (dq, dk, dv)), bias=bias4,
                     bias_grad=bias_grad, rng=rng, varlen=varlen,
                     causal=is_causal, bottom_right=bottom_right, window=window_size, scale=sm_scale,
                     dropout_p=float(dropout_p), softcap=float(softcap),
                     alibi_slopes=alibi_slopes,
                     deterministic=deterministic or torch.are_deterministic_algorithms_enabled())

    for written, wanted in zip((dq, dk, dv), g4):
        if written is not wanted:
            wanted.copy_(written)
    return grads
